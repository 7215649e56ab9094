"""The fake OpenAI engine of the unit tier, streaming: a request with ``"stream": true`` gets
Server-Sent Events of ``chat.completion.chunk`` objects, one word of the echo per chunk. ``mode``
makes it misbehave: ``garbage`` (lines that are not SSE), ``bad_json`` (a ``data:`` that is not
JSON), ``cut`` (the connection dropped after two chunks), ``no_finish`` (a clean end without a
finish_reason or ``[DONE]``), ``error_chunk`` (an ``{"error": ...}`` chunk mid-stream), ``stall``
(a chunk, then silence), ``linger`` (the response kept open after ``[DONE]``). It records streams
the client closed before their end, and the client port of each stream (one per connection)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fake_openai import FakeEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse


def _chunk(content: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    doc: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        doc["usage"] = usage
    return f"data: {json.dumps(doc)}\n\n".encode()


@dataclass
class StreamingFakeEngine(FakeEngine):
    mode: str = "ok"
    token_delay_s: float = 0.0
    #: streams closed by the client before their last chunk
    abandoned: int = 0
    #: streams fully sent
    completed: int = 0
    #: the client's port of each streamed request (a reused connection repeats its port)
    peers: list[int] = field(default_factory=list)
    #: when each fully sent stream sent its last chunk (``time.monotonic()``)
    ended: list[float] = field(default_factory=list)
    #: stream even when the request did not ask to (as some proxies do)
    always_stream: bool = False

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if not body.get("stream") and not self.always_stream:
            return await super()._chat(_Replay(request, body))
        self.bodies.append(body)
        self.peers.append(request.client.port if request.client else 0)
        if self.faults:
            status, headers, payload = self.faults.pop(0)
            return JSONResponse(payload, status_code=status, headers=headers)
        last = body["messages"][-1]["content"]
        text = last if isinstance(last, str) else last[-1]["text"]
        words = f"echo: {text}".split(" ")
        pieces = [w if i == 0 else f" {w}" for i, w in enumerate(words)]
        headers = {"X-Request-Id": "eng-1"}
        return StreamingResponse(self._events(pieces), media_type="text/event-stream", headers=headers)

    async def _events(self, pieces: list[str]) -> AsyncIterator[bytes]:
        finished = False
        self.inflight += 1
        self.max_seen = max(self.max_seen, self.inflight)
        try:
            yield b'data: {"id": "chatcmpl-fake", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
            for i, piece in enumerate(pieces):
                await asyncio.sleep(self.token_delay_s)
                if self.mode == "garbage" and i == 1:
                    yield b"<html>502 Bad Gateway</html>\n\n"
                if self.mode == "bad_json" and i == 1:
                    yield b"data: {not json\n\n"
                if self.mode == "cut" and i == 2:
                    raise ConnectionResetError("the fake engine drops the connection")
                if self.mode == "error_chunk" and i == 1:
                    yield b'data: {"error": "CUDA out of memory"}\n\n'
                    return
                if self.mode == "stall" and i == 1:
                    await asyncio.sleep(3600)
                yield _chunk(piece)
            if self.mode == "no_finish":
                finished = True
                return
            usage = {"prompt_tokens": 5, "completion_tokens": len(pieces), "total_tokens": 5 + len(pieces)}
            yield _chunk(finish="stop", usage=usage)
            yield b"data: [DONE]\n\n"
            finished = True
            self.ended.append(time.monotonic())
            if self.mode == "linger":
                await asyncio.sleep(3600)
        finally:
            self.inflight -= 1
            if finished:
                self.completed += 1
            else:
                self.abandoned += 1


class _Replay(Request):
    """The request again for the non-streaming handler, whose body was already read."""

    def __init__(self, request: Request, body: dict[str, Any]) -> None:
        super().__init__(request.scope, request.receive)
        self._doc = body

    async def json(self) -> Any:
        return self._doc
