"""Serve a graph over HTTP: ``/v1/infer`` (JSON or multipart), the Open Inference Protocol v2
(KServe v2 / Triton HTTP, with binary tensors), Prometheus ``/metrics`` and OpenTelemetry spans.

Needs the ``serve`` extra (``pip install 'usg[serve]'``)::

    from usg.serve import create_app
    app = create_app(load_graph("graph.yaml"), max_inflight=32)
"""

from __future__ import annotations

from usg.errors import MissingDependency

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise MissingDependency(_exc.name or "starlette", "serve", "usg.serve (the HTTP server)") from None

from usg.serve.app import create_app
from usg.serve.context import ServeConfig, ServeContext, ServeState
from usg.serve.metrics import ServeMetrics
from usg.serve.tracing import TracingObserver, make_tracer_provider

__all__ = [
    "ServeConfig",
    "ServeContext",
    "ServeMetrics",
    "ServeState",
    "TracingObserver",
    "create_app",
    "make_tracer_provider",
]
