"""The SSE response on its own, driven as an ASGI app: keep-alive comments while the producer is
silent, a client disconnect closing the producer and freeing the slot (``on_close``), the body
sent through the scope's raw ``send``, and events that arrived together sent as one piece."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("starlette")

from usg.errors import BackendError
from usg.runtime.events import (
    EventSink,
    ExecutionEvent,
    Finished,
    NodeFinished,
    TokenDelta,
    stream_event_batches,
    stream_events,
)
from usg.runtime.result import InferResult
from usg.serve.infer_stream import Renderer, event_stream, v1_renderer
from usg.serve.sse import HEARTBEAT, RAW_SEND, EventStreamResponse, sse_data, sse_event

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


def test_the_head_goes_through_send_and_the_body_through_the_raw_send() -> None:
    """Starlette's error layers see the response start; each body piece skips them."""

    async def run() -> tuple[list[str], list[str]]:
        wrapped: list[str] = []
        raw: list[str] = []

        async def chunks() -> AsyncGenerator[bytes, None]:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            wrapped.append(message["type"])

        async def raw_send(message: dict[str, Any]) -> None:
            raw.append(message["type"] if message["type"] != "http.response.body" else message["body"].decode())

        async with asyncio.timeout(10):
            await EventStreamResponse(chunks())({**SCOPE, RAW_SEND: raw_send}, receive, send)
        return wrapped, raw

    assert asyncio.run(run()) == (["http.response.start"], ["data: 1\n\n", "data: 2\n\n", ""])


def test_event_batches_hand_over_what_arrived_together_and_a_lone_event_at_once() -> None:
    result = InferResult(outputs={"a": 1})

    async def main(fail: bool) -> list[list[ExecutionEvent]]:
        gates = [asyncio.Event(), asyncio.Event()]

        async def run(sink: EventSink) -> InferResult:
            for i in range(3):  # in one loop step: one batch
                sink(TokenDelta("n", str(i)))
            await gates[0].wait()
            sink(TokenDelta("n", "3"))  # alone: handed over while the run still waits
            await gates[1].wait()
            sink(NodeFinished("n", 1.0))
            if fail:
                raise BackendError("engine down")
            return result

        seen: list[list[ExecutionEvent]] = []
        with contextlib.suppress(BackendError):
            async with asyncio.timeout(10):
                async for batch in stream_event_batches(run):
                    seen.append(batch)
                    if len(seen) <= 2:
                        gates[len(seen) - 1].set()
        return seen

    tokens = [TokenDelta("n", str(i)) for i in range(4)]
    assert asyncio.run(main(False)) == [tokens[:3], [tokens[3]], [NodeFinished("n", 1.0), Finished(result)]]
    assert asyncio.run(main(True)) == [tokens[:3], [tokens[3]], [NodeFinished("n", 1.0)]]


class _Ctx:
    """What :func:`event_stream` uses of a ServeContext: ``stream`` (here: fixed batches) and the
    rejection metric."""

    def __init__(self, batches: list[list[ExecutionEvent]]) -> None:
        self.batches = batches
        self.metrics = self
        self.rejected: list[str] = []

    def stream(self, raw: object, request_id: str, expected: object) -> AsyncGenerator[list[ExecutionEvent], None]:
        async def gen() -> AsyncGenerator[list[ExecutionEvent], None]:
            for batch in self.batches:
                await asyncio.sleep(0)
                yield batch

        return gen()

    def reject(self, reason: str) -> None:
        self.rejected.append(reason)


def _bodies(ctx: _Ctx, renderer: Renderer) -> list[bytes]:
    async def run() -> list[bytes]:
        bodies: list[bytes] = []

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                bodies.append(message["body"])

        response = await event_stream(ctx, {}, "r1", None, renderer)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            await response(SCOPE, receive, send)
        return bodies

    return asyncio.run(run())


def test_a_batch_of_events_is_one_body_piece_in_order_and_a_lone_token_its_own() -> None:
    result = InferResult(outputs={"answer": "abc"})
    tokens: list[ExecutionEvent] = [TokenDelta("answer", t) for t in "abc"]
    batches: list[list[ExecutionEvent]] = [
        [NodeFinished("prompt", 0.5)],
        tokens[:2],
        [tokens[2]],
        [NodeFinished("answer", 9.0), Finished(result)],
    ]
    renderer = v1_renderer("r1")
    bodies = _bodies(_Ctx(batches), renderer)
    expected = [b"".join(renderer.event(e) or b"" for e in batch) for batch in batches]
    assert bodies == [*expected, b""]
    # what the client reads: every event, in order, the result last
    wire = b"".join(bodies).decode()
    assert [line for line in wire.split("\n") if line.startswith("event:")] == [
        "event: node",
        "event: token",
        "event: token",
        "event: token",
        "event: node",
        "event: result",
    ]
    assert '"text":"a"' in wire.split("event: token")[1] and '"text":"c"' in wire.split("event: token")[3]


def test_a_batch_whose_event_fails_to_render_sends_those_before_it_then_the_error() -> None:
    class Failing(Renderer):
        def __init__(self) -> None:
            self.inner = v1_renderer("r1")

        def event(self, event: ExecutionEvent) -> bytes | None:
            if isinstance(event, NodeFinished) and event.node == "bad":
                raise BackendError("cannot render")
            return self.inner.event(event)

        def error(self, exc: BackendError) -> bytes:  # type: ignore[override]
            return self.inner.error(exc)

    tokens = [TokenDelta("answer", t) for t in "ab"]
    ctx = _Ctx([[tokens[0]], [tokens[1], NodeFinished("bad", 1.0), NodeFinished("never", 1.0)]])
    renderer = Failing()
    bodies = _bodies(ctx, renderer)
    assert bodies[:2] == [renderer.event(tokens[0]), renderer.event(tokens[1])]
    assert bodies[2].startswith(b"event: error\n") and b"cannot render" in bodies[2]
    assert bodies[3:] == [b""]


def test_a_keep_alive_never_starts_while_an_event_is_being_sent() -> None:
    """The pump's send to a slow reader and the heartbeat's never overlap (each message whole)."""

    async def run() -> tuple[list[bytes], int]:
        bodies: list[bytes] = []
        busy = [0, 0]  # sends under way, most at once

        async def chunks() -> AsyncGenerator[bytes, None]:
            for i in range(3):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0.03)  # silent: keep-alives are due

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            if message["type"] != "http.response.body":
                return
            busy[0] += 1
            busy[1] = max(busy)
            if message["body"].startswith(b"data:"):
                await asyncio.sleep(0.03)  # a slow reader: the send is paused, past heartbeat_s
            else:
                await asyncio.sleep(0)
            bodies.append(message["body"])
            busy[0] -= 1

        async with asyncio.timeout(10):
            await EventStreamResponse(chunks(), heartbeat_s=0.01)(SCOPE, receive, send)
        return bodies, busy[1]

    bodies, most = asyncio.run(run())
    assert most == 1
    assert [b for b in bodies if b != HEARTBEAT] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert HEARTBEAT in bodies
