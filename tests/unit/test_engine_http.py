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
                with pytest.raises(EngineTimeout, match=rf"no bytes from the engine at {srv.url} for 0.3 s"):
                    _ = [p async for p in resp.aiter_bytes()]
        with pytest.raises(EngineTransportError, match=f"cannot connect to {gone}"):
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


# -- a hostile engine ------------------------------------------------------------------------------
SSE_BODY = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
)
DRIPPED = {
    "chunked": OK + b"".join(_chunk(SSE_BODY[i : i + 40]) for i in range(0, len(SSE_BODY), 40)) + b"0\r\n\r\n",
    "content-length": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
    % (len(SSE_BODY), SSE_BODY),
    "close-delimited": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + SSE_BODY,
}


def test_a_response_split_at_every_byte_boundary_parses_in_every_framing() -> None:
    from usg.backends.openai_stream import CallRecorder, ChatStreamReader

    async def drip(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        framing = ""
        while framing != "close-delimited":  # which ends with the connection (the handler's return)
            request = await srv.next_request(reader)
            framing = request.split(b" ")[1].decode().strip("/")
            answer = DRIPPED[framing]
            for i in range(len(answer)):  # one byte a write, the reader woken in between
                writer.write(answer[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0)

    async def go() -> None:
        async with Scripted(drip) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            for framing in DRIPPED:
                reader = ChatStreamReader(CallRecorder("m", srv.url), "test")
                pieces: list[bytes] = []
                take = reader.sink(None)

                def sink(piece: bytes, pieces: list[bytes] = pieces, take: Any = take) -> bool:
                    pieces.append(piece)
                    return bool(take(piece))

                async with client.stream("POST", f"{srv.url}/{framing}", json={}) as resp:
                    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
                    await resp.consume(sink)
                assert reader.finish() == "Hello", framing
                assert reader.call.finish_reason == "stop" and reader.call.request_id == "c1"
                assert len(pieces) > 10, framing  # it really came in pieces
            assert srv.connections == 1  # kept alive after the chunked and the content-length answers

    _run(go())


def test_interim_1xx_204_and_304_responses() -> None:
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-final: yes\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",  # no body, whatever the length says
        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlast",
    ]

    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.next_request(reader)
            writer.write(answers[len(srv.requests) - 1])
            await writer.drain()

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            first = await client.get(f"{srv.url}/")
            assert (first.status_code, first.content, dict(first.headers)) == (
                200,
                b"ok",
                {"content-length": "2", "x-final": "yes"},
            )
            assert [(r.status_code, r.content) for r in [await client.get(f"{srv.url}/") for _ in range(3)]] == [
                (204, b""),
                (304, b""),
                (200, b"last"),
            ]
            assert srv.connections == 1  # none of them left the connection unusable

    _run(go())


def test_switching_protocols_and_an_unrequested_second_response_are_refused() -> None:
    async def upgrade(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\nxx")
        await writer.drain()
        await asyncio.sleep(5)

    async def twice(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.next_request(reader)
            ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            writer.write(ok + ok if len(srv.requests) == 1 else ok)  # a second answer nobody asked for
            await writer.drain()

    async def go() -> None:
        async with Scripted(upgrade) as srv:
            with pytest.raises(EngineTransportError, match=rf"engine at {srv.url} .*switched protocols"):
                await EngineClient(srv.url, timeout_s=5, max_idle=1).get(f"{srv.url}/")
        async with Scripted(twice) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            assert (await client.get(f"{srv.url}/")).content == b"ok"
            assert (await client.get(f"{srv.url}/")).content == b"ok"
            assert srv.connections == 2  # the connection that carried the extra answer was not reused

    _run(go())


def test_a_connection_left_unread_or_failed_never_returns_to_the_pool() -> None:
    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.next_request(reader)
            writer.write(OK + _chunk(b"data: one\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(_chunk(b"data: two\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=4)
            async with client.stream("POST", f"{srv.url}/", json={}):
                pass  # headers read, body not: closed
            with pytest.raises(ZeroDivisionError):  # the caller failed mid-body: closed
                async with client.stream("POST", f"{srv.url}/", json={}) as resp:
                    await resp.consume(lambda piece: bool(1 / 0))

            async def cancelled() -> None:
                async with client.stream("POST", f"{srv.url}/", json={}) as resp:
                    await resp.consume(lambda piece: False)

            task = asyncio.create_task(cancelled())
            await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client._idle == []
            async with client.stream("POST", f"{srv.url}/", json={}) as resp:  # read to its end: pooled
                assert b"".join([p async for p in resp.aiter_bytes()]) == b"data: one\n\ndata: two\n\n"
            assert len(client._idle) == 1
            assert srv.connections == 4

    _run(go())


def _linger_reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed engine with unread bytes does."""
    import socket
    import struct

    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def test_a_stale_pooled_connection_is_retried_once_only_where_it_cannot_run_twice() -> None:
    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while True:
            request = await srv.next_request(reader)
            n += 1
            if n > 1 and b"/reset" in request:
                _linger_reset(writer)  # refused unread, as a crashed engine does: a reset
                return
            if n > 1 and b"/ok" not in request:
                return  # taken, then the connection ends cleanly without an answer
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    def paths(srv: Scripted) -> list[bytes]:
        return [r.split(b" ")[1] for r in srv.requests]

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            assert (await client.post(f"{srv.url}/ok", json={})).content == b"ok"
            assert (await client.post(f"{srv.url}/reset", json={})).content == b"ok"  # reset unread: sent again
            assert paths(srv) == [b"/ok", b"/reset", b"/reset"] and srv.connections == 2
            with pytest.raises(EngineTransportError, match=rf"engine at {srv.url} closed the connection"):
                await client.post(f"{srv.url}/taken", json={})  # the engine may have run it: not sent twice
            assert paths(srv)[3:] == [b"/taken"] and srv.connections == 2
            assert (await client.get(f"{srv.url}/get")).content == b"ok"  # a new connection
            assert (await client.get(f"{srv.url}/get")).content == b"ok"  # taken, closed: a GET is sent again
            assert paths(srv)[4:] == [b"/get", b"/get", b"/get"] and srv.connections == 4

    _run(go())


def test_a_pooled_connection_the_engine_closed_is_dropped_before_writing() -> None:
    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # the engine's keep-alive timeout

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            for _ in range(3):
                assert (await client.post(f"{srv.url}/", json={})).content == b"ok"
                await asyncio.sleep(0.05)  # the engine's FIN arrives while the connection is idle
            assert len(srv.requests) == 3 and srv.connections == 3  # no request was written to a closed one

    _run(go())


def test_a_whole_body_read_skips_the_streaming_context_manager_and_keeps_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # session 15: post/get read the body without EngineClient.stream's async context manager (and
    # without a timeout or an async generator when the body came with the head); same pooling
    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await srv.next_request(reader)
            if b"/split" in request:  # the head first, the body later: the waiting path
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"split")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    def no_stream(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a whole body read went through EngineClient.stream")

    async def go() -> None:
        async with Scripted(handler) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            monkeypatch.setattr(client, "stream", no_stream)
            for path in ("/a", "/split", "/b"):
                resp = await client.post(f"{srv.url}{path}", json={"q": 1})
                assert resp.status_code == 200 and resp.content == (b"split" if path == "/split" else b"ok")
            assert (await client.get(f"{srv.url}/c")).content == b"ok"
            assert len(srv.requests) == 4 and srv.connections == 1 and len(client._idle) == 1

    _run(go())


def test_huge_heads_and_bodies_are_refused_with_the_engine_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.backends import engine_http

    monkeypatch.setattr(engine_http, "MAX_BODY_BYTES", 1000)

    async def huge(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await srv.next_request(reader)
        if b"/head" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nx-big: ")
            for _ in range(1000):  # 1 MB of one header value, never ending
                writer.write(b"a" * 1000)
                await writer.drain()
        elif b"/length" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n" + b"x" * 5000)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 5000)  # close-delimited
        await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        async with Scripted(huge) as srv:
            client = EngineClient(srv.url, timeout_s=5, max_idle=1)
            with pytest.raises(EngineTransportError, match=rf"engine at {srv.url} sent a response head over 65536"):
                await client.get(f"{srv.url}/head")
            for path in ("/length", "/close"):
                with pytest.raises(EngineTransportError, match=rf"engine at {srv.url} sent a body over 1000 bytes"):
                    await client.get(f"{srv.url}{path}")
            assert client._idle == []

    _run(go())


def test_a_slow_drip_cannot_hold_a_head_or_a_whole_body_past_the_timeout() -> None:
    async def drip(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await srv.next_request(reader)
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: 400\r\n\r\n" + b"x" * 400
        if b"/body" in request:
            writer.write(answer[:40])
            answer = answer[40:]
        for i in range(len(answer)):  # a byte every 20 ms: never silent for the 0.3 s timeout
            writer.write(answer[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.02)

    async def go() -> None:
        async with Scripted(drip) as srv:
            client = EngineClient(srv.url, timeout_s=0.3, max_idle=1)
            with pytest.raises(EngineTimeout, match=rf"no response head from the engine at {srv.url} within 0.3 s"):
                await client.get(f"{srv.url}/head")
            with pytest.raises(EngineTimeout, match=rf"the body from the engine at {srv.url} took over 0.3 s"):
                await client.get(f"{srv.url}/body")

    _run(go())


def test_the_backend_retries_429_and_503_honouring_retry_after_on_one_connection() -> None:
    import email.utils
    import time

    from usg.backends.openai import OpenAIBackend, _retry_after

    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    errors = [
        b'HTTP/1.1 429 Too Many Requests\r\nretry-after: 0\r\ncontent-length: 28\r\n\r\n{"error":{"message":"busy"}}',
        b"HTTP/1.1 503 Unavailable\r\nretry-after: %s\r\ncontent-length: 2\r\n\r\n{}" % past.encode(),
    ]

    async def handler(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.next_request(reader)
            n = len(srv.requests)
            writer.write(errors[n - 1] if n <= len(errors) else OK + _chunk(SSE_BODY) + b"0\r\n\r\n")
            await writer.drain()

    async def go() -> None:
        async with Scripted(handler) as srv:
            backend = OpenAIBackend({"url": srv.url, "model": "m", "max_model_len": 4096, "retries": 2}, name="llm")
            out = await backend.ainfer({"messages": "hi"})
            await backend.aclose()
            assert out == {"text": "Hello"}
            assert len(srv.requests) == 3 and srv.connections == 1  # the error bodies were read: reused

    _run(go())
    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3 < _retry_after({"retry-after": soon}, 0) <= 5
    assert _retry_after({"retry-after": "120"}, 0) == 30.0  # capped
    assert _retry_after({"retry-after": "nan"}, 1) == _retry_after({"retry-after": "soon"}, 1) == 1.0  # backoff


def test_cancelling_the_backend_mid_stream_closes_the_engine_connection() -> None:
    from usg.backends.openai import OpenAIBackend

    async def endless(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(OK)
        while True:
            writer.write(_chunk(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'))
            await writer.drain()
            await asyncio.sleep(0.01)

    async def go() -> None:
        async with Scripted(endless) as srv:
            backend = OpenAIBackend({"url": srv.url, "model": "m", "max_model_len": 4096}, name="llm")
            tokens: list[str] = []
            task = asyncio.create_task(backend.astream({"messages": "hi"}, tokens.append))
            while len(tokens) < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if srv.closed_by_client:
                    break
                await asyncio.sleep(0.01)
            assert srv.closed_by_client == 1 and backend.inflight == 0
            await backend.aclose()

    _run(go())


def test_the_backend_answers_a_protocol_violation_with_a_502_naming_the_model_and_engine() -> None:
    from usg.backends.openai import OpenAIBackend
    from usg.errors import BackendError

    async def huge_head(srv: Scripted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 100_000)
        await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        async with Scripted(huge_head) as srv:
            for stream in (True, False):
                options = {"url": srv.url, "model": "m", "max_model_len": 4096, "engine_stream": stream}
                backend = OpenAIBackend(options, name="llm")
                with pytest.raises(
                    BackendError, match=rf"model 'llm': the engine at {srv.url} sent a response head"
                ) as err:
                    await backend.ainfer({"messages": "hi"})
                assert err.value.status == 502
                await backend.aclose()

    _run(go())
