"""The HTTP app: lifecycle, admission, routes.

``create_app(graph)`` returns a Starlette app usable in-process (TestClient, httpx
``ASGITransport`` inside ``app.router.lifespan_context``) or under uvicorn
(``usg serve``). Its lifespan loads the models on startup and, on shutdown,
waits for accepted requests to finish before closing the executor (which
finishes its queued items). The server's state is explicit
(:class:`ServeState`): readiness is true only in ``READY``; in ``DRAINING``
new inference requests get 503 ``draining``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg.backends import Backend
from usg.errors import StateError, USGError
from usg.graph import Graph
from usg.runtime import Executor, InferResult
from usg.runtime.executor import ExecutorState
from usg.serve.errors import DrainingError, error_response, rejection_reason
from usg.serve.limits import InflightGate, check_content_length
from usg.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from usg.serve.tracing import TracingObserver

__all__ = ["ServeConfig", "ServeContext", "ServeState", "create_app"]

log = logging.getLogger("usg.serve")


class ServeState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ServeConfig:
    """Limits of one server. ``timeout_s`` is the per-request deadline (None: the executor's)."""

    max_inflight: int = 64
    max_body_bytes: int = 32 * 2**20
    timeout_s: float | None = None
    drain_timeout_s: float = 120.0
    retry_after_s: float = 1.0


class ServeContext:
    """Everything the routes share: graph, executor, gate, metrics, tracing, state."""

    def __init__(
        self,
        graph: Graph,
        executor: Executor,
        config: ServeConfig,
        metrics: ServeMetrics,
        tracing: TracingObserver | None,
    ) -> None:
        self.graph = graph
        self.executor = executor
        self.config = config
        self.metrics = metrics
        self.tracing = tracing
        self.gate = InflightGate(config.max_inflight, retry_after=config.retry_after_s)
        self.state = ServeState.STARTING
        self.started_at = time.time()
        metrics.set_inflight_source(lambda: float(self.gate.inflight))

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state is ServeState.READY and self.executor.state is ExecutorState.RUNNING

    def begin_draining(self) -> None:
        """Stop admitting inference requests (readiness turns false); accepted ones continue."""
        if self.state in (ServeState.STARTING, ServeState.READY):
            log.info("draining: %d request(s) in flight", self.gate.inflight)
            self.state = ServeState.DRAINING

    async def startup(self) -> None:
        await self.executor.start()
        self.metrics.bind_runners(self.executor.runners)
        if self.state is ServeState.STARTING:
            self.state = ServeState.READY

    async def shutdown(self) -> None:
        self.begin_draining()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.gate.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.gate.inflight:
            log.warning("drain timeout: closing with %d request(s) in flight", self.gate.inflight)
        await self.executor.aclose()
        if self.tracing is not None:
            self.tracing.shutdown()
        self.state = ServeState.STOPPED

    # -- requests ----------------------------------------------------------------------------
    async def infer(
        self, raw: Mapping[str, Any], request_id: str, expect_sha256: Mapping[str, str] | None = None
    ) -> InferResult:
        """Run the graph (the executor decodes encoded images off the event loop)."""
        timeout_s = self.config.timeout_s
        return await self.executor.infer(raw, request_id=request_id, timeout_s=timeout_s, expect_sha256=expect_sha256)

    async def guarded(
        self,
        request: Request,
        endpoint: str,
        work: Callable[[str], Awaitable[Response]],
        *,
        v2: bool = False,
    ) -> Response:
        """Admit (state, declared size, in-flight gate), run ``work(request_id)``, map errors to JSON."""
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        code = 500
        try:
            try:
                if self.state is not ServeState.READY:
                    if self.state is ServeState.STARTING:
                        raise StateError("the server is still loading models; fix: wait for /v2/health/ready")
                    raise DrainingError(
                        "the server is shutting down and accepts no new requests; fix: retry on another replica"
                    )
                check_content_length(request, self.config.max_body_bytes)
                self.gate.acquire()
                try:
                    scope = self.tracing.remote_parent(request.headers) if self.tracing else contextlib.nullcontext()
                    with scope:
                        response = await work(rid)
                finally:
                    self.gate.release()
            except USGError as exc:
                reason = rejection_reason(exc)
                if reason is not None:
                    self.metrics.reject(reason)
                response = error_response(exc, v2=v2, request_id=rid)
            except Exception as exc:  # a bug (ours or a node's) must still answer JSON
                log.exception("request %s failed", rid)
                body = {"error": f"internal error: {type(exc).__name__}: {exc}", "request_id": rid}
                if not v2:
                    body = {"error": "internal", "message": body["error"], "request_id": rid}
                response = JSONResponse(body, status_code=500)
            response.headers["X-Request-Id"] = rid
            code = response.status_code
            return response
        finally:
            self.metrics.http_requests.labels(endpoint, str(code)).inc()


def create_app(
    graph: Graph,
    *,
    executor: Executor | None = None,
    backends: Mapping[str, Backend] | None = None,
    batching: bool = True,
    workers: int | None = None,
    max_inflight: int = 64,
    max_body_mb: float = 32.0,
    timeout_s: float = 60.0,
    tracer_provider: Any | None = None,
    config: ServeConfig | None = None,
) -> Starlette:
    """Build the app serving ``graph``.

    Pass ``executor`` (not yet started) to control it fully; otherwise one is built from
    ``backends`` / ``batching`` / ``workers`` / ``timeout_s``. ``tracer_provider``
    (an OpenTelemetry SDK ``TracerProvider``) turns on spans. The app's
    :class:`ServeContext` is ``app.state.usg``.
    """
    from usg.serve import v1, v2

    metrics = ServeMetrics()
    tracing = TracingObserver(tracer_provider) if tracer_provider is not None else None
    observers = [o for o in (metrics, tracing) if o is not None]
    if executor is None:
        executor = Executor(
            graph,
            backends=backends,
            timeout_s=timeout_s,
            batching=batching,
            workers=workers,
            observers=observers,
        )
    else:
        if executor.state is not ExecutorState.NEW:
            raise StateError(
                f"create_app needs a new executor (it adds its observers before start); "
                f"this one is {executor.state.value}"
            )
        executor.observers.extend(observers)
    cfg = config or ServeConfig(max_inflight=max_inflight, max_body_bytes=int(max_body_mb * 2**20))
    ctx = ServeContext(graph, executor, cfg, metrics, tracing)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await ctx.startup()
        try:
            yield
        finally:
            await ctx.shutdown()

    async def metrics_endpoint(request: Request) -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    routes = [*v1.routes(ctx), *v2.routes(ctx), Route("/metrics", metrics_endpoint, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.usg = ctx
    return app
