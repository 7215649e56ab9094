"""usg serve's uvicorn protocol: a keep-alive connection the client resets is freed at once.

uvicorn (0.55) cancels a connection's keep-alive timer in ``connection_lost`` only on a clean close;
after a reset (``exc`` set) the pending timer held the protocol, its last request cycle and headers
until ``--keepalive-timeout`` passed. These tests run a real uvicorn server in-process with the
protocol class ``usg serve`` configures, reset idle keep-alive connections (SO_LINGER 0) and check
that the protocols are collectable and their timers cancelled, long before the keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from usg.serve import ServeConfig
from usg.serve.server import _protocol_class, uvicorn_config

KEEPALIVE_S = 300.0  # far beyond the test: only a cancelled timer frees the protocols in time


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _config(http: str) -> uvicorn.Config:
    ctx: Any = SimpleNamespace(config=ServeConfig(keepalive_timeout_s=KEEPALIVE_S))
    config = uvicorn_config(_app, ctx, host="127.0.0.1", port=0, log_level="warning")
    config.lifespan = "off"
    if http == "h11":  # what usg serve runs when httptools is not installed
        cfg = ctx.config
        config.http = _protocol_class(cfg.header_timeout_s, cfg.send_timeout_s, H11Protocol)
    return config


async def _answered_keepalive_socket(loop: asyncio.AbstractEventLoop, port: int) -> socket.socket:
    s = socket.socket()
    s.setblocking(False)
    await loop.sock_connect(s, ("127.0.0.1", port))
    await loop.sock_sendall(s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = await loop.sock_recv(s, 4096)
        assert chunk, data
        data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" not in data.lower()
    return s


async def _reset_idle_keepalive_connections(http: str, n: int) -> tuple[list[bool], int]:
    """Serve, answer ``n`` keep-alive requests and reset the idle connections; once the server saw
    every connection lost (still serving): whether each keep-alive timer is cancelled, and how many
    of the protocols are still referenced after a garbage collection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(_config(http))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    clients: list[socket.socket] = []
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        clients = [await _answered_keepalive_socket(loop, port) for _ in range(n)]
        connections: list[Any] = list(server.server_state.connections)
        assert len(connections) == n
        timers = [p.timeout_keep_alive_task for p in connections]
        assert all(t is not None and not t.cancelled() for t in timers)  # idle in keep-alive
        refs = [weakref.ref(p) for p in connections]
        del connections
        for s in clients:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset: the server's connection_lost gets ConnectionResetError
        for _ in range(500):  # until the server saw every reset (5 s at most)
            if not server.server_state.connections:
                break
            await asyncio.sleep(0.01)
        assert not server.server_state.connections
        await asyncio.sleep(0)  # let the transports finish closing
        cancelled = [t.cancelled() for t in timers]
        del timers
        gc.collect()
        return cancelled, sum(r() is not None for r in refs)
    finally:
        for s in clients:
            s.close()
        server.should_exit = True
        await task
        with contextlib.suppress(OSError):
            sock.close()


@pytest.mark.parametrize("http", ["auto", "h11"])
def test_reset_keepalive_connections_cancel_their_timer_and_are_freed(http: str) -> None:
    cancelled, alive = asyncio.run(_reset_idle_keepalive_connections(http, 4))
    assert cancelled == [True] * 4, "a reset connection kept its keep-alive timer pending"
    assert alive == 0, "a reset connection's protocol is still referenced (by its keep-alive timer)"
