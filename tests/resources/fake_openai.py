"""A small fake OpenAI-compatible engine for the unit tier: a Starlette app served by uvicorn on a
free 127.0.0.1 port in a background thread. It records every chat completion it receives, how
many were in flight at once, and can be told to answer with errors first."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from procs import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass
class FakeEngine:
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "tiny", "max_model_len": 4096}])
    #: (status, headers, body) answered before normal replies, one per request (bytes: sent as they are)
    faults: list[tuple[int, dict[str, str], Any]] = field(default_factory=list)
    delay_s: float = 0.0
    #: HTTP status of GET /v1/models (an engine without the route: 404)
    models_status: int = 200
    #: GET /v1/models answers these bytes as they are (application/json) instead of the models list
    models_body: bytes | None = None
    #: a non-streamed answer waits (up to 60 s) for the client to close its connection first
    hold: bool = False
    #: non-streamed requests whose client closed the connection before the answer (with ``hold``)
    closed_early: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: the Accept-Encoding header of each chat request ("" when absent)
    encodings: list[str] = field(default_factory=list)
    inflight: int = 0
    max_seen: int = 0
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _models(self, request: Request) -> JSONResponse:
        if self.models_status != 200:
            return JSONResponse({"detail": "Not Found"}, status_code=self.models_status)
        if self.models_body is not None:
            return Response(self.models_body, media_type="application/json")
        return JSONResponse({"object": "list", "data": self.models})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.encodings.append(request.headers.get("accept-encoding", ""))
        if self.faults:
            status, headers, payload = self.faults.pop(0)
            if isinstance(payload, bytes):
                return Response(payload, status_code=status, headers={"content-type": "application/json", **headers})
            return JSONResponse(payload, status_code=status, headers=headers)
        self.inflight += 1
        self.max_seen = max(self.max_seen, self.inflight)
        try:
            await asyncio.sleep(self.delay_s)
            deadline = time.monotonic() + 60
            while self.hold and time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.closed_early += 1
                    return Response(status_code=204)
                await asyncio.sleep(0.02)
        finally:
            self.inflight -= 1
        last = body["messages"][-1]["content"]
        text = last if isinstance(last, str) else last[-1]["text"]
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": f"echo: {text}"}}]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/v1/models", self._models), Route("/v1/chat/completions", self._chat, methods=["POST"])]
        )


class RunningEngine:
    """``with RunningEngine(FakeEngine()) as engine:`` serves it until the block ends."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        engine.port = free_port()
        config = uvicorn.Config(engine.app(), host="127.0.0.1", port=engine.port, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeEngine:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake engine did not start")
            time.sleep(0.01)
        return self.engine

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
