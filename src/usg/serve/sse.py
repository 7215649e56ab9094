"""Server-Sent Events out: the encoding of one event, and the ASGI response that streams them.

:class:`EventStreamResponse` sends each chunk of an async iterator as it comes, a keep-alive
comment when nothing was sent for ``heartbeat_s``, and watches for the client going away
whatever the server's ASGI version: a disconnect cancels the producer (closing the iterator,
so the request it streams is cancelled, and with it the engine's generation). The producer runs
in the context of the handler that built the response (its trace parent included).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["HEARTBEAT", "RAW_SEND", "EventStreamResponse", "json_str", "sse_data", "sse_event"]

HEARTBEAT = b": keep-alive\n\n"
#: the scope key under which usg's app keeps the ``send`` its server gave it: an event stream sends
#: its head through the app's own ``send`` (Starlette's error layers note that the response
#: started) and each body piece straight through this one (those layers only pass body messages
#: on, one coroutine each a token)
RAW_SEND = "usg.raw_send"


#: ``json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`` without
#: building an encoder per call (json.dumps does, for any non-default argument)
_json: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
#: one JSON string, as ``_json`` writes it (a token event's text is encoded with this alone)
json_str: Callable[[str], str] = json.encoder.encode_basestring


def sse_event(event: str, data: Any) -> bytes:
    """``event: NAME`` and one ``data:`` line of JSON (JSON has no raw newlines), then the blank line."""
    return f"event: {event}\ndata: {_json(data)}\n\n".encode()


def sse_data(data: Any) -> bytes:
    """A ``data:``-only event (what Triton's ``generate_stream`` clients read)."""
    return f"data: {_json(data)}\n\n".encode()


class EventStreamResponse(Response):
    """``text/event-stream`` of ``chunks``; ``on_close`` runs once when the stream ends for any
    reason (the server uses it to free the request's in-flight slot)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str] | None = None,
        heartbeat_s: float = 15.0,
    ) -> None:
        self.chunks = chunks
        self.heartbeat_s = heartbeat_s
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._context = contextvars.copy_context()
        self._on_close: list[Callable[[], None]] = []

    def on_close(self, fn: Callable[[], None]) -> None:
        self._on_close.append(fn)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = _Out(send, scope.get(RAW_SEND, send))
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        try:
            producer = asyncio.create_task(self._pump(out, start), context=self._context)
            watchers = [asyncio.create_task(_disconnected(receive)), asyncio.create_task(self._beat(out))]
            try:
                await asyncio.wait([producer, watchers[0]], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (producer, *watchers):
                    task.cancel()
                await asyncio.gather(producer, *watchers, return_exceptions=True)
        finally:
            for fn in self._on_close:
                fn()

    async def _pump(self, out: _Out, start: dict[str, Any]) -> None:
        # the head goes in the same loop step as the first event: one write (usg serve joins a
        # step's writes), one wake-up of the client
        await out.send(start)
        body_send, beat = out.body_send, out.beat
        async with contextlib.aclosing(self.chunks) as chunks:
            async for chunk in chunks:  # once per token: no lock unless a heartbeat is being sent
                message = {"type": "http.response.body", "body": chunk, "more_body": True}
                if beat.locked():
                    async with beat:
                        await body_send(message)
                else:
                    out.sending = True
                    await body_send(message)
                    out.sending = False
                out.last_sent = time.monotonic()
        async with beat:
            await body_send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _beat(self, out: _Out) -> None:
        """A keep-alive comment whenever nothing was sent for ``heartbeat_s`` (proxies drop idle
        streams); none while an event is being sent (its bytes are under way)."""
        while True:
            idle = time.monotonic() - out.last_sent
            if idle < self.heartbeat_s:
                await asyncio.sleep(self.heartbeat_s - idle)
            elif out.sending:  # an event is under way (to a slow reader): it counts as sent
                out.last_sent = time.monotonic()
            else:
                async with out.beat:
                    await out.body_send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
                out.last_sent = time.monotonic()


class _Out:
    """One event stream's sending side: the ASGI ``send`` (the head), the ``send`` its body goes
    through (:data:`RAW_SEND` when the app put one in the scope), and what keeps the pump's and the
    heartbeat's messages whole and apart: ``sending`` (the pump is inside a send) and ``beat`` (a
    lock the heartbeat holds while it sends, the pump takes only then)."""

    __slots__ = ("beat", "body_send", "last_sent", "send", "sending")

    def __init__(self, send: Send, body_send: Send) -> None:
        self.send, self.body_send = send, body_send
        self.beat = asyncio.Lock()
        self.sending = False
        self.last_sent = time.monotonic()


async def _disconnected(receive: Receive) -> None:
    """Return when the client goes away (the request body was read before the stream started)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
