"""``WS /v1/stream/{graph}``: a streaming session over a WebSocket (wire format: :mod:`usg.stream.wire`).

On connect the server checks its state, the API key (``Authorization: Bearer``), the graph
name and the session limit (a refusal is an ``error`` event, a close code, and a count in
``usg_rejected_requests_total`` by reason, as for HTTP), opens a :class:`~usg.stream.Session`
and sends ``{"type": "session", ...}`` with the session id, the graph's inputs and the limits.
Then two loops run: the receiver turns frames into chunks (a refused or malformed chunk is
answered with an ``error`` event and dropped, the session goes on), the sender writes the
session's events as JSON text frames. The session ends:

- ``{"type": "close"}`` from the client: flush, the remaining events, ``closed``; close code 1000;
- idle for ``idle_timeout_s``: flushed the same way, ``closed`` with reason ``idle_timeout``; 4408;
- a reader that leaves the event queue full for ``slow_reader_s``: ``error`` (when it can still be
  written), then close code 1013; nothing more is buffered for it;
- the client disconnecting: the session is dropped without a flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from prometheus_client import Gauge
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from usg.errors import InputError, Overloaded, USGError
from usg.serve.context import ServeContext
from usg.serve.errors import rejection_reason
from usg.specs import Modality
from usg.stream import Session, SessionManager, error_event
from usg.stream.wire import parse_binary, parse_text

__all__ = ["CLOSE_IDLE", "CLOSE_SLOW_READER", "stream_routes"]

log = logging.getLogger("usg.stream")

CLOSE_IDLE = 4408
CLOSE_SLOW_READER = 1013
CLOSE_POLICY = 1008


def _inputs(ctx: ServeContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, d in ctx.graph.inputs.items():
        info: dict[str, Any] = {"modality": d.modality.value, "optional": d.optional}
        if d.modality is Modality.AUDIO and d.audio is not None:
            info.update(sample_rate=d.audio.sample_rate, channels=1, formats=["pcm16", "f32"])
        out[name] = info
    return out


class _Connection:
    """One WebSocket and its session: a receiver loop, a sender loop, a stall watchdog."""

    def __init__(self, ws: WebSocket, session: Session, manager: SessionManager) -> None:
        self.ws = ws
        self.session = session
        self.manager = manager
        self.lock = asyncio.Lock()
        self.code = 1000
        self.done = asyncio.Event()

    async def send(self, event: dict[str, Any]) -> None:
        async with self.lock:
            await self.ws.send_text(json.dumps(event))

    async def sender(self) -> None:
        try:
            async for event in self.session.events():
                await self.send(event)
                if event["type"] == "closed" and event.get("reason") == "idle_timeout":
                    self.code = CLOSE_IDLE
        finally:
            self.done.set()

    async def watchdog(self) -> None:
        while not self.done.is_set():
            await asyncio.sleep(min(0.5, self.manager.limits.slow_reader_s / 4))
            if self.session.reader_stalled(time.monotonic()):
                self.cut_off()
                self.done.set()

    def cut_off(self) -> None:
        """Drop a session whose reader left its event queue full for ``slow_reader_s``."""
        log.warning(
            "session %s: slow reader, %d events unread for over %g s; closing with %d",
            self.session.id,
            self.session.pending_events,
            self.manager.limits.slow_reader_s,
            CLOSE_SLOW_READER,
        )
        self.code = CLOSE_SLOW_READER
        self.session.abort()

    async def receiver(self) -> None:
        graph, limits = self.manager.executor.graph, self.manager.limits
        while not self.session.closed:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            try:
                if msg.get("bytes") is not None:
                    chunk = parse_binary(graph, msg["bytes"], limits.max_chunk_bytes)
                else:
                    chunk = parse_text(graph, msg.get("text") or "")
                if chunk.kind == "close":
                    await self.session.close("client")
                    return
                self.session.send(chunk.input, chunk.value, chunk.ts_ms)
            except USGError as exc:
                if isinstance(exc, Overloaded) and self.session.reader_stalled(time.monotonic()):
                    self.cut_off()
                    return
                await self.send(error_event(exc))


def stream_routes(ctx: ServeContext) -> list[WebSocketRoute]:
    """The ``/v1/stream/{graph}`` route; its :class:`SessionManager` is ``ctx.sessions``."""
    manager = SessionManager(ctx.executor, ctx.config.stream)
    ctx.sessions = manager
    Gauge(
        "usg_stream_sessions",
        "Streaming sessions open (WS /v1/stream/{graph}; at most --stream-limit max_sessions).",
        registry=ctx.metrics.registry,
    ).set_function(lambda: float(len(manager.sessions)))

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        try:
            ctx.check_state()
            ctx.authorize(ws)
            name = ws.path_params["graph"]
            if name != ctx.graph.name:
                raise InputError(
                    f"this server serves graph {ctx.graph.name!r}, not {name!r}",
                    field="graph",
                    fix=f"connect to /v1/stream/{ctx.graph.name}",
                )
            await manager.start()
            session = manager.open()
        except USGError as exc:
            reason = rejection_reason(exc)
            if reason is not None:  # a refused session counts as a refused HTTP request does
                ctx.metrics.reject(reason)
            await ws.send_text(json.dumps(error_event(exc)))
            await ws.close(CLOSE_POLICY if exc.status in (400, 401, 404) else CLOSE_SLOW_READER)
            return
        conn = _Connection(ws, session, manager)
        await conn.send(
            {
                "type": "session",
                "id": session.id,
                "graph": ctx.graph.name,
                "inputs": _inputs(ctx),
                "event_outputs": list(manager.event_outputs),
                "limits": manager.limits.to_dict(),
            }
        )
        waiter = asyncio.create_task(conn.done.wait())
        tasks = [asyncio.create_task(conn.sender()), asyncio.create_task(conn.watchdog()), waiter]
        receiver = asyncio.create_task(conn.receiver())
        try:
            await asyncio.wait([receiver, waiter], return_when=asyncio.FIRST_COMPLETED)
            error = receiver.exception() if receiver.done() else None
            if isinstance(error, WebSocketDisconnect):
                return
            if error is not None:
                log.error("session %s: receiver failed", session.id, exc_info=error)
                conn.code = 1011
            else:
                await conn.done.wait()
        finally:
            for t in (*tasks, receiver):
                t.cancel()
            await asyncio.gather(*tasks, receiver, return_exceptions=True)
            if not session.closed:
                session.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(conn.code), 2.0)

    return [WebSocketRoute("/v1/stream/{graph}", endpoint)]
