"""The lean HTTP/1.1 client of ``backend: openai`` (usg.backends.engine_http) against scripted raw
asyncio servers on 127.0.0.1: keep-alive reuse, the framings of a body, a connection the engine
closed while idle, malformed HTTP, silence, cancellation, flow control; and when it applies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("httptools")

from usg.backends.engine_http import EngineClient, EngineTimeout, EngineTransportError, lean_client_applies

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (the client always sends Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


class Scripted:
    """A server whose ``handler`` answers each connection; it records the requests and connections."""

    def __init__(self, handler: Callable[[Scripted, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]):
        self.handler = handler
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed_by_client = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Scripted:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            task = asyncio.current_task()
            assert task is not None
            self.tasks.add(task)
            try:
                await self.handler(self, reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.closed_by_client += 1
            except asyncio.CancelledError:
                pass  # the test is over
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def next_request(self, reader: asyncio.StreamReader) -> bytes:
        request = await _request(reader)
        self.requests.append(request)
        return request


async def _keep_alive_sse(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await srv.next_request(reader)
        writer.write(OK + _chunk(b"data: one\n\n"))
        await writer.drain()
        writer.write(_chunk(b"data: two\n\n") + b"0\r\n\r\n")
        await writer.drain()


def _run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main())


def test_requests_share_one_kept_alive_connection_and_bodies_arrive_in_pieces() -> None:
    async def go() -> None:
        async with Scripted(_keep_alive_sse) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            for _ in range(3):
                async with client.stream("POST", f"{srv.url}/v1/chat/completions", json={"q": "é"}) as resp:
                    assert resp.status_code == 200
                    assert resp.headers["content-type"] == "text/event-stream"
                    assert b"".join([p async for p in resp.aiter_bytes()]) == b"data: one\n\ndata: two\n\n"
            await client.aclose()
            assert srv.connections == 1
            head, _, body = srv.requests[0].partition(b"\r\n\r\n")
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"Content-Type: application/json" in head and body == '{"q":"é"}'.encode()

    _run(go())


def test_a_sink_gets_the_body_as_it_is_parsed_and_stops_it() -> None:
    async def go() -> None:
        async with Scripted(_keep_alive_sse) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            seen: list[bytes] = []
            async with client.stream("POST", f"{srv.url}/x", json={}) as resp:
                await resp.consume(lambda piece: seen.append(piece) or b"one" in piece)
            assert seen == [b"data: one\n\n"]  # the sink said "no more" after its first piece
            async with client.stream("POST", f"{srv.url}/x", json={}) as resp:  # the rest was read: reused
                await resp.consume(lambda piece: seen.append(piece) or False)
            assert srv.connections == 1

    _run(go())


def test_framings_content_length_connection_close_and_close_delimited() -> None:
    bodies = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"a": 1}',  # ends when the connection does
    ]

    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        answer = bodies[len(srv.requests) - 1]
        writer.write(answer)
        await writer.drain()
        if b"content-length: 5" in answer:  # keep the connection for the next request
            await srv.next_request(reader)
            writer.write(bodies[len(srv.requests) - 1])
            await writer.drain()

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            assert (await client.get(f"{srv.url}/a")).content == b"hello"
            resp = await client.get(f"{srv.url}/b")
            assert resp.content == b"hi" and resp.text == "hi"
            assert (await client.get(f"{srv.url}/c")).json() == {"a": 1}  # connection: close → a new one
            assert srv.connections == 2
            await client.aclose()

    _run(go())


def test_an_idle_connection_the_engine_closed_is_replaced_once() -> None:
    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()  # then closes (keep-alive timeout on the engine's side)

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            assert (await client.get(f"{srv.url}/a")).content == b"ok"
            assert (await client.get(f"{srv.url}/a")).content == b"ok"
            assert srv.connections == 2

    _run(go())


def test_malformed_http_cut_bodies_silence_and_refused_connections_fail_clearly() -> None:
    async def garbage(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"<html>not http</html>\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def cut(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(OK + _chunk(b"data: one\n\n"))
        await writer.drain()  # and the connection drops mid-body

    async def silent(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(OK + _chunk(b"data: one\n\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        async with Scripted(garbage) as srv:
            with pytest.raises(EngineTransportError, match=r"not valid HTTP/1\.1"):
                await EngineClient(srv.url, timeout_s=5, max_idle=1).get(f"{srv.url}/")
        async with Scripted(cut) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            async with client.stream("POST", f"{srv.url}/", json={}) as resp:
                with pytest.raises(EngineTransportError, match="closed the connection"):
                    await resp.consume(lambda piece: False)
        async with Scripted(silent) as srv:
            gone = srv.url  # nothing listens there once this server closed
            client = EngineClient(srv.url, timeout_s=0.3, max_idle=1)
            async with client.stream("POST", f"{srv.url}/", json={}) as resp:
                with pytest.raises(EngineTimeout, match=r"no bytes for 0.3 s"):
                    _ = [p async for p in resp.aiter_bytes()]
        with pytest.raises(EngineTransportError, match=f"cannot connect to {gone.removeprefix('http://')}"):
            await EngineClient(gone, timeout_s=5, max_idle=1).get(f"{gone}/")

    _run(go())


def test_leaving_a_response_early_closes_its_connection() -> None:
    async def endless(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(OK)
        while True:
            writer.write(_chunk(b"data: tick\n\n"))
            await writer.drain()
            await asyncio.sleep(0.01)

    async def go() -> None:
        async with Scripted(endless) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)

            async def read() -> None:
                async with client.stream("POST", f"{srv.url}/", json={}) as resp:
                    await resp.consume(lambda piece: False)

            task = asyncio.create_task(read())
            await asyncio.sleep(0.1)
            task.cancel()  # the request was cancelled (its client went away)
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if srv.closed_by_client:
                    break
                await asyncio.sleep(0.01)
            assert srv.closed_by_client == 1  # the engine saw the connection close

    _run(go())


def test_a_large_body_pauses_reading_until_the_reader_catches_up() -> None:
    piece = b"x" * 65536
    count = 128  # 8 MiB, twice the high-water mark

    async def big(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(piece) * count))
        for _ in range(count):
            writer.write(piece)
            await writer.drain()

    async def go() -> None:
        async with Scripted(big) as srv:
            resp = await EngineClient(srv.url, timeout_s=5, max_idle=1).get(f"{srv.url}/")
            assert len(resp.content) == len(piece) * count

    _run(go())


def test_lean_client_applies_to_plain_http_without_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert lean_client_applies("http://127.0.0.1:8000")
    assert not lean_client_applies("https://api.example.com")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert not lean_client_applies("http://engine.internal:8000")
    monkeypatch.setenv("NO_PROXY", "engine.internal")
    assert lean_client_applies("http://engine.internal:8000")
    with pytest.raises(ValueError, match="plain http"):
        EngineClient("https://api.example.com", timeout_s=1, max_idle=1)
