"""The SSE response on its own, driven as an ASGI app: keep-alive comments while the producer is
silent, and a client disconnect closing the producer and freeing the slot (``on_close``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("starlette")

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
