"""The start-up heap frozen out of full collections: by the function, and by usg serve's server once it started."""

from __future__ import annotations

import asyncio
import gc
import socket
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn

from usg.runtime.heap import freeze_startup_heap
from usg.serve.server import UsgServer


@pytest.fixture(autouse=True)
def _unfreeze() -> Any:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_moves_live_objects_out_of_the_collector() -> None:
    kept = [{"n": i} for i in range(1000)]  # tracked containers alive at the freeze
    assert gc.get_freeze_count() == 0
    frozen = freeze_startup_heap()
    # (the count can fall right after: frozen objects are still freed when their last reference goes)
    assert frozen >= len(kept) and gc.get_freeze_count() >= len(kept)
    assert not any(o is kept for o in gc.get_objects())  # a full pass no longer walks them
    kept.clear()  # reference counting still frees frozen objects


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def test_usg_server_freezes_the_heap_once_started() -> None:
    asyncio.run(_start_and_stop())


async def _start_and_stop() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, lifespan="on", log_level="warning")
    server = UsgServer(config, SimpleNamespace())  # type: ignore[arg-type]
    server.config.load()
    server.lifespan = config.lifespan_class(config)
    assert gc.get_freeze_count() == 0
    await server.startup(sockets=[sock])
    try:
        assert server.started
        assert gc.get_freeze_count() > 0
    finally:
        await server.shutdown(sockets=[sock])
        sock.close()
