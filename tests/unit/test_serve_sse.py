"""The SSE response on its own, driven as an ASGI app: keep-alive comments while the producer is
silent, and a client disconnect closing the producer and freeing the slot (``on_close``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("starlette")

from usg.errors import BackendError
from usg.runtime.events import EventSink, Finished, NodeFinished, TokenDelta, stream_events
from usg.runtime.result import InferResult
from usg.serve.infer_stream import v1_renderer
from usg.serve.sse import HEARTBEAT, EventStreamResponse, sse_data, sse_event

SCOPE = {"type": "http", "asgi": {"spec_version": "2.4"}}


def test_event_encoding() -> None:
    assert sse_event("token", {"text": "a\nb"}) == b'event: token\ndata: {"text":"a\\nb"}\n\n'
    assert sse_data({"text_output": "é"}) == 'data: {"text_output":"é"}\n\n'.encode()


def test_a_silent_producer_gets_keep_alive_comments() -> None:
    async def run() -> list[bytes]:
        beat = asyncio.Event()
        bodies: list[bytes] = []

        async def chunks() -> AsyncGenerator[bytes, None]:
            await beat.wait()  # silent until a keep-alive went out
            yield b"data: 1\n\n"

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client stays
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                bodies.append(message["body"])
                if message["body"] == HEARTBEAT:
                    beat.set()

        async with asyncio.timeout(10):
            await EventStreamResponse(chunks(), heartbeat_s=0.01)(SCOPE, receive, send)
        return bodies

    bodies = asyncio.run(run())
    assert bodies[0] == HEARTBEAT and bodies[-2:] == [b"data: 1\n\n", b""]


def test_a_disconnect_closes_the_producer_and_runs_on_close() -> None:
    async def run() -> tuple[list[str], list[bytes]]:
        log: list[str] = []
        bodies: list[bytes] = []
        first_sent = asyncio.Event()

        async def chunks() -> AsyncGenerator[bytes, None]:
            try:
                yield b"data: 1\n\n"
                await asyncio.Event().wait()  # would stream forever
                yield b"data: 2\n\n"
            finally:
                log.append("producer closed")

        async def receive() -> dict[str, Any]:
            await first_sent.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                bodies.append(message["body"])
                first_sent.set()

        response = EventStreamResponse(chunks())
        response.on_close(lambda: log.append("on_close"))
        async with asyncio.timeout(10):
            await response(SCOPE, receive, send)
        return log, bodies

    log, bodies = asyncio.run(run())
    assert log == ["producer closed", "on_close"]
    assert bodies == [b"data: 1\n\n"]


@pytest.mark.parametrize(
    ("node", "text"),
    [("answer", "The"), ("answer", ""), ('a"n\\', 'é\n\t"\\ \u2028 \x00 😀'), ("ünï", "</script>")],
)
def test_a_token_event_is_what_sse_event_writes(node: str, text: str) -> None:
    renderer = v1_renderer("r1")
    for _ in range(2):  # the second time from the node's cached head
        assert renderer.event(TokenDelta(node, text)) == sse_event("token", {"node": node, "text": text})


def test_stream_events_yields_buffered_events_in_order_then_the_result_or_the_error() -> None:
    result = InferResult(outputs={"a": 1})

    async def run(sink: EventSink, fail: bool) -> InferResult:
        for i in range(3):  # several in one loop step: all buffered before the reader runs
            sink(TokenDelta("n", str(i)))
        await asyncio.sleep(0)
        sink(NodeFinished("n", 1.0))
        await asyncio.sleep(0.01)  # the reader waits for the next one
        sink(TokenDelta("m", "x"))
        if fail:
            raise BackendError("engine down")
        return result

    async def collect(fail: bool) -> list[object]:
        seen: list[object] = []
        with contextlib.suppress(BackendError):
            async for event in stream_events(lambda sink: run(sink, fail)):
                seen.append(event)
        return seen

    expected = [
        TokenDelta("n", "0"),
        TokenDelta("n", "1"),
        TokenDelta("n", "2"),
        NodeFinished("n", 1.0),
        TokenDelta("m", "x"),
    ]
    assert asyncio.run(collect(False)) == [*expected, Finished(result)]
    assert asyncio.run(collect(True)) == expected


def test_closing_stream_events_early_cancels_the_run() -> None:
    cancelled = asyncio.Event()

    async def run(sink: EventSink) -> InferResult:
        sink(TokenDelta("n", "a"))
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    async def main() -> None:
        events = stream_events(run)
        assert await anext(events) == TokenDelta("n", "a")
        await events.aclose()
        assert cancelled.is_set()

    asyncio.run(main())
