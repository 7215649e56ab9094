"""The least a process in front of the engine can do, as ``benchmarks/llm_overhead.py``'s floor.

A Starlette app under uvicorn (uvloop, httptools, no access log: ``usg serve``'s own settings)
with one route, ``POST /v1/infer``: it reads ``{"inputs": {"question": ...}}``, builds the same
chat completion ``usg.ops.llm:chat`` builds and posts it through USG's own engine client
(:class:`usg.backends.engine_http.EngineClient`, at most ``max_inflight`` at once, like the
``openai`` backend).

* A plain question (no ``"stream": true``) asks for one whole completion and answers
  ``{"outputs": {"answer": ...}}``.
* A streamed one (``"stream": true`` in the body, or ``?stream=true``, as ``usg serve`` takes it)
  asks the engine for a streamed completion and answers Server-Sent Events in ``usg serve``'s
  wire format: an ``event: token`` (``{"node": "answer", "text": ...}``) for each content delta
  as its engine chunk arrives (the deltas of one chunk in one write), then ``event: result``
  (``{"outputs": {"answer": ...}}``). An engine status other than 200 is answered with 502 before
  the stream starts; a stream that breaks, or ends before ``data: [DONE]`` or a ``finish_reason``,
  ends with ``event: error`` (the benchmark's clients count neither as answered).

No graph, validation, limits, metrics, tracing, node events, heartbeats or disconnect watching
(the response is sent from the request's own task): what is left of ``usg serve``'s CPU a
question is the HTTP in, the HTTP out, the engine's stream parsed once and the loopback TCP that
any proxy on this machine pays.

Run: ``python benchmarks/bare_llm_proxy.py ENGINE_URL MODEL PORT MAX_TOKENS MAX_INFLIGHT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from usg.backends.engine_http import EngineClient
from usg.ops.llm import chat

TOKEN_HEAD = b'event: token\ndata: {"node":"answer","text":'
_json_str = json.encoder.encode_basestring  # one JSON string, as usg serve writes a token's text


class Events(Response):
    """``text/event-stream`` of the engine's streamed answer (see the module docstring), sent from
    the request's task: no task, lock or timer per request or token."""

    media_type = "text/event-stream"

    def __init__(self, state: dict[str, Any], url: str, body: dict[str, Any]) -> None:
        # not self.body: Response.init_headers would give it a Content-Length
        self.state, self.url, self.engine_body = state, url, body
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.state["sem"], self.state["client"].stream("POST", self.url, json=self.engine_body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", errors="replace")[:500]
                await Response(f"engine HTTP {resp.status_code}: {text}", status_code=502)(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            try:
                async for chunk in _events(resp.aiter_bytes()):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except Exception as exc:  # a broken or cut-off engine stream: an error event, then the end
                error = json.dumps({"status": 502, "message": f"{type(exc).__name__}: {exc}"})
                await send({"type": "http.response.body", "body": f"event: error\ndata: {error}\n\n".encode()})
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _events(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The SSE bytes to send for each piece of the engine's stream (its ``data:`` lines parsed
    once, the content deltas of a piece in one write), then, once the engine's body ended, the
    result event; raises if the body ends before ``data: [DONE]`` or a chunk with a
    ``finish_reason`` (``transformers serve`` sends no ``[DONE]``)."""
    rest = b""
    parts: list[str] = []
    done = finished = False  # data: [DONE] came; a chunk gave a finish_reason
    async for piece in pieces:  # read to the body's end after [DONE], so the connection is kept for reuse
        if done:
            continue
        lines = (rest + piece).split(b"\n")
        rest = lines.pop()
        out = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank lines, event:/id: lines, comments
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            choices = json.loads(data).get("choices")
            if not choices:
                continue  # a usage-only chunk
            finished = finished or bool(choices[0].get("finish_reason"))
            text = (choices[0].get("delta") or {}).get("content")
            if text:
                parts.append(text)
                out.append(TOKEN_HEAD + _json_str(text).encode() + b"}\n\n")
        if out:
            yield b"".join(out)
    if not (done or finished):
        raise ValueError(f"the engine's stream ended without a finish_reason or [DONE] after {len(parts)} deltas")
    yield b"event: result\ndata: " + json.dumps({"outputs": {"answer": "".join(parts)}}).encode() + b"\n\n"


def app(engine_url: str, model: str, max_tokens: int, max_inflight: int) -> Starlette:
    state: dict[str, Any] = {}
    url = f"{engine_url}/v1/chat/completions"

    async def infer(request: Request) -> Response:
        if "client" not in state:  # on the server's loop
            state["client"] = EngineClient(engine_url, 300.0, max_inflight)
            state["sem"] = asyncio.Semaphore(max_inflight)
        doc = json.loads(await request.body())
        messages = chat(system="Be brief.", user="Question: {question}", question=doc["inputs"]["question"])
        body = {"model": model, "messages": messages["messages"], "max_tokens": max_tokens}
        if doc.get("stream") is True or (
            request.scope["query_string"] and request.query_params.get("stream") == "true"
        ):
            return Events(state, url, {**body, "stream": True, "stream_options": {"include_usage": True}})
        async with state["sem"]:
            resp = await state["client"].post(url, json=body)
        answer = resp.json()["choices"][0]["message"]["content"]
        return Response(json.dumps({"outputs": {"answer": answer}}), media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response("ready")

    return Starlette(routes=[Route("/v1/infer", infer, methods=["POST"]), Route("/v2/health/ready", ready)])


def main() -> None:
    engine_url, model, port, max_tokens, max_inflight = sys.argv[1:6]
    uvicorn.run(
        app(engine_url, model, int(max_tokens), int(max_inflight)),
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
        access_log=False,
        http="httptools",
        loop="uvloop",
    )


if __name__ == "__main__":
    main()
