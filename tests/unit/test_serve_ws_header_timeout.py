"""usg serve's uvicorn protocol and WebSockets: the header timeout ends with the upgrade.

``--header-timeout`` closes a connection whose request headers are not complete in time. A
WebSocket handshake is such a request, but once it is upgraded the connection belongs to the
WebSocket protocol: the header timer must not fire on it. It did (found on ``usg serve``: every
``WS /v1/stream`` session was cut 10 s after it connected, close code 1006, no close frame).
These tests run a real uvicorn server in-process with the protocol classes ``usg serve``
configures and a header timeout of 0.3 s, and keep a WebSocket talking past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from usg.serve import ServeConfig
from usg.serve.server import _protocol_class, uvicorn_config

websockets = pytest.importorskip("websockets", reason="needs websockets (usg[test])")

HEADER_TIMEOUT_S = 0.3


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": msg.get("text") or ""})


async def _talk_past_the_header_timeout(http: str) -> list[str]:
    ctx: Any = SimpleNamespace(config=ServeConfig(header_timeout_s=HEADER_TIMEOUT_S))
    config = uvicorn_config(_echo, ctx, host="127.0.0.1", port=0, log_level="warning")
    config.lifespan = "off"
    if http == "h11":  # what usg serve runs when httptools is not installed
        config.http = _protocol_class(HEADER_TIMEOUT_S, ctx.config.send_timeout_s, H11Protocol)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        echoed = []
        async with websockets.connect(f"ws://127.0.0.1:{sock.getsockname()[1]}/") as ws:
            for i in range(5):  # 5 x 0.2 s: three times the header timeout, the connection busy throughout
                await ws.send(str(i))
                echoed.append(await ws.recv())
                await asyncio.sleep(0.2)
        return echoed
    finally:
        server.should_exit = True
        await task
        with contextlib.suppress(OSError):
            sock.close()


@pytest.mark.parametrize("http", ["auto", "h11"])
def test_a_websocket_outlives_the_header_timeout_of_its_handshake(http: str) -> None:
    assert asyncio.run(_talk_past_the_header_timeout(http)) == ["0", "1", "2", "3", "4"]
