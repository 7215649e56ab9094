"""The ingress deployment: the embedded server's HTTP app over an executor with remote models.

Same routes as ``usg serve`` (``/v1/infer``, Open Inference Protocol v2, ``/metrics``), same
admission (in-flight gate, body limit) and error bodies; the executor plans, prunes, fans out
and gathers exactly as in-process, calling models (and Python nodes marked
``own_deployment``) through their deployments' handles. Models marked ``own_deployment: false``
are loaded and batched in the router like in-process (no handle: the executor creates them).
With ``otel`` the router exports the same request / node / queue / compute spans as
``usg serve --otel`` (a remote model's queue + compute is the round trip to its deployment).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from usg.graph.model import Graph
from usg.runtime import Executor
from usg.runtime.heap import freeze_startup_heap
from usg.scale.ray_remote import RayFn, RayModelBackend
from usg.serve.app import ServeConfig, create_app
from usg.serve.tracing import make_tracer_provider

__all__ = ["Router"]


class Router:
    def __init__(
        self,
        graph: Graph,
        models: Mapping[str, Any],
        nodes: Mapping[str, Any],
        config: ServeConfig,
        timeout_s: float,
        otel: str | None = None,
    ) -> None:
        self.graph = graph
        self.model_handles = dict(models)
        self.node_handles = dict(nodes)
        self.config = config
        self.timeout_s = timeout_s
        self.otel = otel

    def __serve_build_asgi_app__(self) -> Any:
        models = {
            m: RayModelBackend(
                m, h, batching=self.graph.models[m].batch.enabled, engine=self.graph.models[m].backend == "openai"
            )
            for m, h in self.model_handles.items()
        }
        nodes = {n: RayFn(n, h) for n, h in self.node_handles.items()}
        executor = Executor(self.graph, backends=models, fns=nodes, timeout_s=self.timeout_s)
        provider = make_tracer_provider(self.otel, service_name=f"usg:{self.graph.name}") if self.otel else None
        app = create_app(self.graph, executor=executor, config=self.config, tracer_provider=provider)
        metrics = app.state.usg.metrics
        for retry in [b.retry for b in models.values()] + [f.retry for f in nodes.values()]:
            retry.on_retry = metrics.remote_retry  # usg_remote_retries_total on /metrics
        transports = [b.transport for b in models.values()] + [b.transport_many for b in models.values()]
        for transport in transports + [f.transport for f in nodes.values()]:
            transport.listeners.append(metrics.remote_bytes_moved)  # usg_remote_bytes_total
        _freeze_after_startup(app)
        return app


def _freeze_after_startup(app: Any) -> None:
    """The replica serves this graph for its lifetime: once the app started (models loaded),
    freeze its heap out of the collector's full passes, as ``usg serve`` does (usg.runtime.heap)."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        async with inner(a):
            freeze_startup_heap()
            yield

    app.router.lifespan_context = lifespan
