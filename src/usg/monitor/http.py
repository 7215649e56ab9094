"""``GET /v1/monitor`` (drift, health, reference versions) and ``GET /v1/monitor/window`` (the current
window as a profile, for ``usg drift ref.json window.json``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from usg.monitor.live import LiveMonitor

__all__ = ["jsonable", "monitor_routes"]


def jsonable(value: Any) -> Any:
    """NaN and infinities become None (JSON has no NaN); containers recurse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def monitor_routes(monitor: LiveMonitor) -> list[Route]:
    async def snapshot(request: Request) -> Response:
        monitor.authorize(request)
        return JSONResponse(jsonable(monitor.snapshot()))

    async def window(request: Request) -> Response:
        monitor.authorize(request)
        return JSONResponse(jsonable(monitor.window_profile()))

    return [
        Route("/v1/monitor", snapshot, methods=["GET"]),
        Route("/v1/monitor/window", window, methods=["GET"]),
    ]
