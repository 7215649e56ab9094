"""The HTTP app factory: ``/v1`` and ``/v2`` sub-apps (each with its own error formatter), ``/metrics``.

``create_app(graph)`` returns a Starlette app usable in-process (TestClient, httpx
``ASGITransport`` inside ``app.router.lifespan_context``) or under uvicorn
(``usg serve``). Its lifespan loads the models on startup and, on shutdown,
waits for accepted requests to finish before closing the executor (which
finishes its queued items). The shared state lives in :mod:`usg.serve.context`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Message, Receive, Scope, Send

from usg.backends import Backend
from usg.errors import StateError, USGError
from usg.graph import Graph
from usg.runtime import Executor
from usg.runtime.executor import ExecutorState
from usg.serve import openapi, v1, v2
from usg.serve.align_metrics import AlignMetrics
from usg.serve.context import ServeConfig, ServeContext, ServeState
from usg.serve.errors import exception_handlers, v1_error, v2_error
from usg.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from usg.serve.sse import RAW_SEND
from usg.serve.stream_ws import stream_routes
from usg.serve.tracing import TracingObserver

if TYPE_CHECKING:
    from usg.monitor.addon import ServeAddon

__all__ = ["ServeConfig", "ServeContext", "ServeState", "create_app"]


class _App(Starlette):
    """Starlette that notes in the scope the ``send`` it was given (:data:`usg.serve.sse.RAW_SEND`):
    an event stream's body goes through it, past the error layers inside (they only watch the
    response's start). A start-up that failed with a USG error (a model that cannot load: its
    message names the fix) is reported as that message, not as the lifespan's traceback."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            send = _startup_failure_as_message(send, self.state.usg)
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


def _startup_failure_as_message(send: Send, ctx: ServeContext) -> Send:
    """``send`` with a ``lifespan.startup.failed`` caused by a :class:`USGError` carrying its message
    (what the server prints) instead of Starlette's traceback; other failures keep the traceback."""

    async def clean(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed" and ctx.startup_error is not None:
            err = ctx.startup_error
            message = {**message, "message": f"cannot start: {type(err).__name__}: {err}"}
        await send(message)

    return clean


def create_app(
    graph: Graph,
    *,
    executor: Executor | None = None,
    backends: Mapping[str, Backend] | None = None,
    batching: bool = True,
    workers: int | None = None,
    max_inflight: int = 64,
    max_body_mb: float | None = None,
    timeout_s: float = 60.0,
    cpu_slots: int | None = None,
    tracer_provider: Any | None = None,
    config: ServeConfig | None = None,
    extra_routes: Sequence[Callable[[ServeContext], list[Route]]] = (),
    addons: Sequence[ServeAddon] = (),
) -> Starlette:
    """Build the app serving ``graph``.

    Pass ``executor`` (not yet started) to control it fully; otherwise one is built from
    ``backends`` / ``batching`` / ``workers`` / ``timeout_s`` / ``cpu_slots`` (the executor's CPU
    gate: None one call per usable core, 0 off; ``usg serve --cpu-slots``). ``tracer_provider``
    (an OpenTelemetry SDK ``TracerProvider``) turns on spans. The app's
    :class:`ServeContext` is ``app.state.usg``. ``extra_routes``: factories of more routes
    (e.g. ``usg.index.http.search_routes(INDEX)`` for ``POST /v1/search``), given the context.
    """
    metrics = ServeMetrics()
    tracing = TracingObserver(tracer_provider) if tracer_provider is not None else None
    align = AlignMetrics(metrics.registry, graph) if any(n.align for n in graph.nodes.values()) else None
    observers = [o for o in (metrics, tracing, align, *addons) if o is not None]
    if executor is None:
        executor = Executor(
            graph,
            backends=backends,
            timeout_s=timeout_s,
            batching=batching,
            workers=workers,
            observers=observers,
            cpu_slots=cpu_slots,
        )
    else:
        if executor.state is not ExecutorState.NEW:
            raise StateError(
                f"create_app needs a new executor (it adds its observers before start); "
                f"this one is {executor.state.value}"
            )
        executor.observers.extend(observers)
    body = int(max_body_mb * 2**20) if max_body_mb is not None else None
    cfg = config or ServeConfig(max_inflight=max_inflight, max_body_bytes=body)
    ctx = ServeContext(graph, executor, cfg, metrics, tracing)
    ctx.addons = list(addons)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await ctx.startup()
        except USGError as exc:  # reported as its message (_App)
            ctx.startup_error = exc
            raise
        try:
            yield
        finally:
            await ctx.shutdown()

    async def metrics_endpoint(request: Request) -> Response:
        ctx.authorize(request)
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def openapi_endpoint(request: Request) -> Response:
        return JSONResponse(openapi.document(graph))

    def handlers(fmt: Any) -> Mapping[Any, Any]:
        return exception_handlers(fmt, lambda req, exc, resp: ctx.count(req, exc, resp.status_code))

    routes: list[BaseRoute] = [
        *(route for make in extra_routes for route in make(ctx)),
        *(r for addon in addons for r in addon.routes()),
        *stream_routes(ctx),  # WS /v1/stream/{graph}
        # /v1 routes sit in this app (whose error formatter is v1's): no sub-app in the hot path
        *v1.routes(ctx, prefix="/v1"),
        Route("/v2", v2.server_metadata(ctx), methods=["GET"]),  # Mount("/v2") matches "/v2/..." only
        Mount("/v2", app=Starlette(routes=v2.routes(ctx), exception_handlers=handlers(v2_error))),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint, methods=["GET"]),
    ]
    app = _App(routes=routes, lifespan=lifespan, exception_handlers=handlers(v1_error))
    app.state.usg = ctx
    return app
