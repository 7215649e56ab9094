"""Running the app under uvicorn: a header timeout, the port checked first, a drain on SIGTERM.

* **Port first**: :func:`hold_port` binds the address before any model loads, so a busy
  port fails in a second with the fix instead of after the models loaded, and keeps it bound
  until uvicorn listens on that socket, so no process started meanwhile is given the port.
* **Slow clients**: a connection must deliver a request's complete headers within
  ``header_timeout_s`` of connecting (or of sending the first byte after a response), else
  it is closed (a WebSocket handshake's timer ends with the upgrade: the session is not cut);
* **Large heads**: a request head (request line and headers) that passes
  :data:`MAX_REQUEST_HEAD_BYTES` before it ends is answered 431 (a JSON body naming the limit)
  and the connection closed. httptools sets no limit of its own: the head was kept whole until it
  ended or the header timeout passed (one client sent 3 GB of headers in 4 s, before any
  authentication, and the server's memory grew by as much);
  an idle keep-alive connection is closed after ``keepalive_timeout_s``
  (uvicorn's own timer); bodies have the app's body timeout (:mod:`usg.serve.context`).
* **Reset connections**: a connection the client resets (or that fails) while idle in keep-alive
  has its keep-alive timer cancelled at once; uvicorn (0.55 and before) cancels it only on a clean
  close, so each reset connection's protocol, last request cycle and headers stayed referenced by
  the timer until ``keepalive_timeout_s`` passed.
* **Slow readers**: a connection whose client leaves the server's writes unread — the transport's
  buffer above its high-water mark, no progress — for ``send_timeout_s`` is aborted, HTTP and
  WebSocket alike. Without this a client that never reads a large response or event stream (and
  keeps its side open) held the connection and its buffers for ever: asyncio's ``close()`` waits
  for the buffer to drain.
* **SIGTERM**: the server keeps listening while it drains, answering new requests 503
  ``draining`` with ``Connection: close`` (no connection resets), and shuts uvicorn down
  once the accepted requests are answered (or ``drain_timeout_s`` passed). A second signal
  stops at once (uvicorn's graceful shutdown still waits for responses in progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import struct
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol
from uvicorn.server import logger as uvicorn_logger

from usg.errors import USGError
from usg.runtime.heap import freeze_startup_heap
from usg.serve.context import ServeContext
from usg.stream.wire import MAX_HEADER_BYTES

__all__ = ["MAX_REQUEST_HEAD_BYTES", "PortInUse", "UsgServer", "hold_port", "uvicorn_config"]

#: longest request head (request line and headers) taken from a client; longer ones get 431
MAX_REQUEST_HEAD_BYTES = 64 * 1024
#: how long a connection refused for its head is still read (and what comes dropped) before it closes
_LINGER_S = 2.0


class PortInUse(USGError):
    """``usg serve --port N`` names a port another process listens on (exit code 1)."""


def hold_port(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` before the models load and keep it bound (not yet listening) until the
    server listens on this very socket (``UsgServer.run(sockets=[...])``): a busy port fails at once,
    and nothing started in between — Ray's processes under ``--engine ray`` pick free ports while the
    models load — can be handed this port by the kernel (automatic port choice skips bound ports)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is already in use by another process; "
                f"fix: pass a free --port, or stop the process listening there (e.g. `ss -ltnp 'sport = :{port}'`)"
            ) from None
        raise PortInUse(f"cannot listen on {host}:{port} ({exc.strerror}); fix: pass another --host/--port") from None
    return s


class _JoinedWrites:
    """A connection's transport that joins the writes made in one event-loop step into one.

    uvicorn writes a response's status line and headers, then its body: two ``send`` calls,
    two TCP segments and two wake-ups of the client for every JSON answer. Writes are held
    until the end of the current loop step (``call_soon``) and sent together; ``close``
    sends what is held first. After a protocol switch (WebSocket upgrade) writes pass through.
    Everything else is the wrapped transport's.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._through = False

    def write(self, data: bytes) -> None:
        if self._through:
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._flush()
        self._through = True
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _with_send_deadline(base: Any, send_timeout_s: float) -> Any:
    """``base`` (a uvicorn protocol) aborting its connection once the transport has stayed paused —
    its write buffer above the high-water mark, the client reading nothing — for ``send_timeout_s``."""

    class SendDeadlineProtocol(base):
        _usg_send_timer: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._usg_send_timer is None:
                self._usg_send_timer = self.loop.call_later(send_timeout_s, self._usg_send_expired)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._usg_cancel_send_timer()

        def _usg_cancel_send_timer(self) -> None:
            if self._usg_send_timer is not None:
                self._usg_send_timer.cancel()
                self._usg_send_timer = None

        def _usg_send_expired(self) -> None:
            self._usg_send_timer = None
            transport = self.transport
            if transport is None:
                return
            uvicorn_logger.warning(
                "a client left %d bytes unread for %g s (--send-timeout); connection aborted",
                transport.get_write_buffer_size(),
                send_timeout_s,
            )
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a reset, so the kernel drops the unsent bytes too (no FIN_WAIT orphan)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self._usg_cancel_send_timer()
            super().connection_lost(exc)

    return SendDeadlineProtocol


def _ws_protocol_class(send_timeout_s: float) -> Any:
    """uvicorn's WebSocket protocol with the send deadline ("auto" if no WebSocket library is installed)."""
    return "auto" if AutoWebSocketsProtocol is None else _with_send_deadline(AutoWebSocketsProtocol, send_timeout_s)


def _protocol_class(
    header_timeout_s: float,
    send_timeout_s: float,
    http: type[asyncio.Protocol] = AutoHTTPProtocol,
    max_head_bytes: int = MAX_REQUEST_HEAD_BYTES,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``http`` (httptools', else h11's) with a deadline for a request's
    headers, a bound on their size (httptools'), the send deadline, and its keep-alive timer
    cancelled however the connection ends."""
    base: Any = _with_send_deadline(http, send_timeout_s)
    if not hasattr(http, "on_headers_complete"):  # h11's protocol: h11 bounds a head itself (16 KiB)
        max_head_bytes = 1 << 62

    class HeaderTimeoutProtocol(base):
        # One timer per connection, not one per request: a request's first bytes note the time
        # (``_usg_since``) and arm the timer only if none is pending; its complete headers clear
        # the time without cancelling the timer, which, when it fires, closes the connection if
        # the noted headers are overdue, waits for the rest of the deadline if they are not, and
        # ends if no headers are awaited (uvloop makes and frees a timer handle per call_later).
        _usg_timer: asyncio.TimerHandle | None = None
        _usg_since: float | None = None

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._usg_since is None:
                self._usg_since = self.loop.time()
            if self._usg_timer is None:
                self._usg_timer = self.loop.call_at(self._usg_since + header_timeout_s, self._usg_expire)

        def _disarm(self) -> None:
            self._usg_since = None  # the pending timer (if any) finds nothing awaited

        def _usg_expire(self) -> None:
            self._usg_timer = None
            since = self._usg_since
            if since is None or self.transport.is_closing():
                return
            due = since + header_timeout_s
            if due > self.loop.time():  # headers noted after the timer was armed: the rest of their time
                self._usg_timer = self.loop.call_at(due, self._usg_expire)
            elif self._idle():
                self.transport.close()  # headers never completed: a stalled or slowloris client

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(_JoinedWrites(transport, self.loop))
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._usg_refused:
                return  # the rest of a refused head: read and dropped until the connection closes
            if self._idle():
                self._arm()  # first bytes of a request: its headers must complete in time
            if self._usg_head_open:
                self._usg_head_bytes += len(data)
            super().data_received(data)
            if not self._idle():
                self._disarm()
            if self._usg_head_open and self._usg_head_bytes > max_head_bytes and not self.transport.is_closing():
                self._usg_head_too_large()

        # The bytes of a request head not complete yet (the parser's callbacks say where heads
        # begin and end; a pipelined request's head counts too): at most one read past the limit
        # is parsed before the 431. Only httptools' protocol has these callbacks; h11 limits heads itself.
        _usg_head_open = True
        _usg_head_bytes = 0
        _usg_refused = False

        def on_headers_complete(self) -> None:
            self._usg_head_open = False
            self._usg_head_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._usg_head_open = True  # what follows on this connection is the next request's head

        def _usg_head_too_large(self) -> None:
            uvicorn_logger.warning(
                "a request head passed %d bytes (%d received before its end); answered 431 and closed",
                max_head_bytes,
                self._usg_head_bytes,
            )
            body = json.dumps(
                {
                    "error": "header_too_large",
                    "message": f"the request head (request line and headers) passed {max_head_bytes} bytes "
                    f"({self._usg_head_bytes} received before its end)",
                    "fix": "send a shorter URL and fewer or smaller headers (cookies, tokens); "
                    f"heads over {max_head_bytes // 1024} KiB are refused",
                }
            ).encode()
            head = (
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            )
            self._usg_cancel()
            self._usg_refused = True
            if not self._idle():  # a pipelined request is still being answered: no answer to put first
                self.transport.close()
                return
            # the answer, then a lingering close: the rest the client is still sending is read and
            # dropped for a moment, since closing with unread bytes resets the connection, and a
            # reset can discard the answer before the client reads it
            self.transport.write(head + body)
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)

        def _usg_cancel(self) -> None:
            if self._usg_timer is not None:
                self._usg_timer.cancel()
                self._usg_timer = None
            self._usg_since = None

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # the connection now belongs to the WebSocket protocol (this one never hears of it again,
            # not even connection_lost): a pending header timer would close it mid-session
            self._usg_cancel()
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            self._usg_cancel()
            super().connection_lost(exc)
            # uvicorn cancels its keep-alive timer only when exc is None (a clean close): after a
            # reset the pending timer kept this protocol, its cycle and headers for the keep-alive timeout
            keepalive = getattr(self, "timeout_keep_alive_task", None)
            if keepalive is not None:
                keepalive.cancel()
                self.timeout_keep_alive_task = None

    return HeaderTimeoutProtocol


class UsgServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM/SIGINT instead of closing its sockets."""

    def __init__(self, config: uvicorn.Config, ctx: ServeContext) -> None:
        super().__init__(config)
        self.ctx = ctx
        self._drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.ctx.config.drain_timeout_s
            self.ctx.begin_draining()  # readiness false, new requests 503; sockets stay open
            return
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # the lifespan loaded the models: freeze what start-up built (usg.runtime.heap)
            freeze_startup_heap(uvicorn_logger)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_deadline is not None and (not self.ctx.busy or time.monotonic() > self._drain_deadline):
            self.should_exit = True
        return await super().on_tick(counter)


WS_MAX_QUEUE = 8  # unread frames a WebSocket connection holds (the session reads them as they come)


def ws_frame_limit(max_chunk_bytes: int) -> int:
    """The largest WebSocket frame read: twice a session's chunk payload limit plus the chunk's header."""
    return 2 * max_chunk_bytes + 4 + MAX_HEADER_BYTES


def uvicorn_config(app: Any, ctx: ServeContext, *, host: str, port: int, log_level: str) -> uvicorn.Config:
    cfg = ctx.config
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=_protocol_class(cfg.header_timeout_s, cfg.send_timeout_s),
        ws=_ws_protocol_class(cfg.send_timeout_s),
        # a WebSocket frame is read whole before the session sees it: cap it near the session's chunk limit
        # (frames up to twice the limit still get the session's 413 event naming it; larger ones are closed
        # with 1009 by the WebSocket library) and hold few unread frames, not uvicorn's 32 x 16 MiB
        ws_max_size=ws_frame_limit(cfg.stream.max_chunk_bytes),
        ws_max_queue=WS_MAX_QUEUE,
        access_log=False,  # usg.access logs each inference request (with its request id and digests)
        timeout_keep_alive=max(1, round(cfg.keepalive_timeout_s)),
        timeout_graceful_shutdown=int((cfg.timeout_s or 60.0) + 10),
    )
