"""Gauges of the long-lived calls that each hold a slot while open: streaming sessions
(``usg_stream_sessions``; gRPC ``ModelStreamInfer`` streams are in test_grpc_service.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.applications import Starlette

from usg.graph import Graph, GraphBuilder
from usg.serve import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "serve"))


def _graph() -> Graph:
    return (
        GraphBuilder("g")
        .input("text", "text")
        .node("echo", fn="slow_ops:slow_echo", inputs={"text": "inputs.text"})
        .output("echo", "echo.text")
        .build()
    )


def _gauge(app: Starlette, name: str) -> float:
    for line in app.state.usg.metrics.render().decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_open_streaming_sessions_are_a_gauge() -> None:
    # before: the sessions holding --stream-limit max_sessions were seen only when one more was refused
    app = create_app(_graph())

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            sessions = app.state.usg.sessions  # the manager behind WS /v1/stream/{graph}
            assert _gauge(app, "usg_stream_sessions") == 0
            await sessions.start()
            one, two = sessions.open(), sessions.open()
            assert _gauge(app, "usg_stream_sessions") == 2
            await one.close()
            two.abort()
            assert _gauge(app, "usg_stream_sessions") == 0

    asyncio.run(scenario())
