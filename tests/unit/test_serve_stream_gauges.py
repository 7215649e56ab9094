"""Gauges of the long-lived calls that each hold a slot while open: WebSocket streaming sessions
(``usg_stream_sessions``) and gRPC ``ModelStreamInfer`` streams (``usg_grpc_streams``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.applications import Starlette
from starlette.testclient import TestClient

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


def test_open_websocket_sessions_are_a_gauge() -> None:
    # before: the sessions holding --stream-limit max_sessions were seen only when one more was refused
    app = create_app(_graph())
    with TestClient(app) as client:
        assert _gauge(app, "usg_stream_sessions") == 0
        with client.websocket_connect("/v1/stream/g") as ws:
            assert ws.receive_json()["type"] == "session"
            assert _gauge(app, "usg_stream_sessions") == 1
        for _ in range(200):  # the server side ends its sessions after the clients closed
            if _gauge(app, "usg_stream_sessions") == 0:
                break
            time.sleep(0.01)
        assert _gauge(app, "usg_stream_sessions") == 0
