"""What every route shares: the graph, executor, limits, gates, metrics, tracing and the state.

The server's state is explicit (:class:`ServeState`): readiness is true only in ``READY``;
in ``DRAINING`` new inference requests get 503 ``draining`` (with ``Connection: close``)
while accepted ones finish. An inference request is admitted in this order, each step
refusing before the next one costs anything: state (503), API key (401), declared body size
(413), a free in-flight slot (429, none taken yet), the body received within the body
timeout and the receive budget (408 / 429), then the in-flight slot is taken and the work runs,
cancelled if the client closes its connection before its answer (499, :class:`ClientGone`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import hmac
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from usg.errors import StateError, USGError
from usg.graph import Graph
from usg.runtime import Executor, InferResult
from usg.runtime.events import ExecutionEvent, stream_event_batches
from usg.runtime.executor import ExecutorState
from usg.serve.errors import ClientGone, DrainingError, InternalError, Unauthorized, rejection_reason
from usg.serve.limits import BodyBudget, InflightGate, RequestLimits, check_content_length, declared_length, read_body
from usg.serve.metrics import ServeMetrics
from usg.serve.sse import EventStreamResponse
from usg.serve.tracing import TracingObserver
from usg.stream.limits import SessionLimits

if TYPE_CHECKING:
    from usg.monitor.addon import ServeAddon
    from usg.stream import SessionManager

__all__ = ["ServeConfig", "ServeContext", "ServeState", "Work", "new_request_id"]

log = logging.getLogger("usg.serve")
#: one line per answered inference request: method, path, status, ms, request id, input digests
access_log = logging.getLogger("usg.access")
_INTEGRITY_KEPT = 4096

Work = Callable[[Request, str, bytes], Awaitable[Response]]
_V4 = ~((0xF000 << 64) | (0xC000 << 48))  # the version and variant bits of a UUID


def new_request_id() -> str:
    """A request id: ``uuid.uuid4().hex`` (the same random bits, version 4 and RFC 4122 variant)
    without building a :class:`uuid.UUID` (a few µs a request; benchmarks/README.md "LLM overhead",
    session 15)."""
    n = int.from_bytes(os.urandom(16), "big") & _V4 | (0x4000 << 64) | (0x8000 << 48)
    return f"{n:032x}"


async def _unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response:
    """``work``, cancelled (:class:`ClientGone`) if the client closes its connection first: an answer
    nobody reads must not keep the request's slot, its place in the batch queues, or an engine
    generating for it. The body was read, so the next ASGI message is the disconnect; a watcher task
    waits for it (a few µs a request) and cancels this one."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientGone("the client closed its connection before its answer; the request was cancelled") from None
    finally:
        watcher.cancel()


class ServeState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ServeConfig:
    """Limits of one server. ``timeout_s`` is the per-request deadline (None: the executor's).

    ``max_body_bytes`` None takes the graph's ``limits.max_body_bytes`` (default 32 MiB).
    ``body_timeout_s`` bounds how long a request's body may take to arrive; ``header_timeout_s``
    ``send_timeout_s`` and ``keepalive_timeout_s`` are applied by the HTTP server (``usg serve``). ``api_key``
    (``--api-key-env``) is required as ``Authorization: Bearer`` on inference, metadata and
    metrics; health stays open.
    """

    max_inflight: int = 64
    max_body_bytes: int | None = None
    timeout_s: float | None = None
    drain_timeout_s: float = 120.0
    retry_after_s: float = 1.0
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    #: a client that leaves the server's writes unread this long is disconnected (``usg serve``)
    send_timeout_s: float = 30.0
    keepalive_timeout_s: float = 5.0
    api_key: str | None = None
    #: limits of each streaming session (``WS /v1/stream/{graph}``; ``usg serve --stream-limit``)
    stream: SessionLimits = field(default_factory=SessionLimits)


class ServeContext:
    """Everything the routes share: graph, executor, limits, gates, metrics, tracing, state."""

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
        self.limits = RequestLimits.of(graph.limits, max_body_bytes=config.max_body_bytes)
        self.gate = InflightGate(config.max_inflight, retry_after=config.retry_after_s)
        # bodies being received may reserve as much as the in-flight requests may hold
        self.receiving = BodyBudget(config.max_inflight * self.limits.max_body_bytes, retry_after=config.retry_after_s)
        self.state = ServeState.STARTING
        #: why the start-up failed, when a USG error said it (printed as its message, no traceback)
        self.startup_error: USGError | None = None
        self.started_at = time.time()
        self.addons: list[ServeAddon] = []  # usg.monitor: drift monitor, trace file
        self.sessions: SessionManager | None = None  # streaming sessions (usg.serve.stream_ws)
        # request id -> input digests, for the access-log line; bounded (gRPC answers without a log line)
        self._integrity: collections.OrderedDict[str, Mapping[str, str]] = collections.OrderedDict()
        metrics.set_inflight_source(lambda: float(self.gate.inflight))

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state is ServeState.READY and self.executor.state is ExecutorState.RUNNING

    @property
    def busy(self) -> int:
        """Requests accepted and not answered yet: in flight, or still receiving their body."""
        return self.gate.inflight + self.receiving.receiving

    def begin_draining(self) -> None:
        """Stop admitting inference requests (readiness turns false); accepted ones continue."""
        if self.state in (ServeState.STARTING, ServeState.READY):
            log.info("draining: %d request(s) in flight", self.gate.inflight)
            self.state = ServeState.DRAINING

    async def startup(self) -> None:
        await self.executor.start()
        self.metrics.bind_runners(self.executor.runners)
        self.metrics.bind_gate(self.executor.cpu_gate)
        for addon in self.addons:
            addon.bind(self)
        if self.state is ServeState.STARTING:
            self.state = ServeState.READY

    async def shutdown(self) -> None:
        self.begin_draining()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.busy:
            log.warning("drain timeout: closing with %d request(s) in flight", self.busy)
        if self.sessions is not None:  # flush open streaming sessions while the models still run
            await self.sessions.aclose()
        await self.executor.aclose()
        for addon in self.addons:
            addon.close()
        if self.tracing is not None:
            self.tracing.shutdown()
        self.state = ServeState.STOPPED

    # -- admission ---------------------------------------------------------------------------
    def check_state(self) -> None:
        if self.state is ServeState.READY:
            return
        if self.state is ServeState.STARTING:
            raise StateError("the server is still loading models; fix: wait for /v2/health/ready")
        raise DrainingError("the server is shutting down and accepts no new requests; fix: retry on another replica")

    def authorize(self, request: HTTPConnection) -> None:
        """401 unless ``Authorization: Bearer <key>`` matches ``--api-key-env`` (when one is set)."""
        key = self.config.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise Unauthorized(
                "this server requires an API key; fix: send the header 'Authorization: Bearer <key>' "
                "with the key the server was started with (usg serve --api-key-env NAME)"
            )

    async def receive(self, request: Request) -> bytes:
        """The whole body, within the size limit, the body timeout and the receive budget."""
        limit = self.limits.max_body_bytes
        reserve = min(declared_length(request) or limit, limit)
        self.receiving.reserve(reserve)
        try:
            return await read_body(request, limit, timeout_s=self.config.body_timeout_s)
        finally:
            self.receiving.release(reserve)

    async def infer(
        self, raw: Mapping[str, Any], request_id: str, expect_sha256: Mapping[str, str] | None = None
    ) -> InferResult:
        """Run the graph (the executor decodes encoded images off the event loop); ``expect_sha256``:
        the digests a client sent for its inputs (a mismatch is a 400 naming both)."""
        for addon in self.addons:
            addon.note_raw(request_id, raw)
        result = await self.executor.infer(
            raw, request_id=request_id, timeout_s=self.config.timeout_s, expect_sha256=expect_sha256
        )
        self._integrity[request_id] = result.integrity  # for the access-log line (popped by count)
        while len(self._integrity) > _INTEGRITY_KEPT:
            self._integrity.popitem(last=False)
        return result

    def stream(
        self, raw: Mapping[str, Any], request_id: str, expect_sha256: Mapping[str, str] | None = None
    ) -> AsyncGenerator[list[ExecutionEvent], None]:
        """:meth:`infer` as events (:meth:`usg.runtime.Executor.stream`), those that arrived together
        as one list (:func:`usg.runtime.events.stream_event_batches`: a server writes each list as
        one piece); closing it cancels the request."""
        for addon in self.addons:
            addon.note_raw(request_id, raw)
        timeout_s, infer = self.config.timeout_s, self.executor.infer
        return stream_event_batches(
            lambda sink: infer(
                raw, timeout_s=timeout_s, request_id=request_id, expect_sha256=expect_sha256, events=sink
            )
        )

    def count(self, request: Request, exc: USGError | None, status: int) -> None:
        """Metrics and the access-log line of one answered request (the error handlers call it for refusals)."""
        endpoint = getattr(request.state, "endpoint", None)
        if exc is not None:
            reason = rejection_reason(exc)
            if reason is not None:
                self.metrics.reject(reason)
        if endpoint is not None:
            self.metrics.http_request(endpoint, status)
            rid = getattr(request.state, "request_id", "-")
            integrity = self._integrity.pop(rid, None) or {}
            if not access_log.isEnabledFor(logging.INFO):
                return
            t0 = getattr(request.state, "started", None)
            access_log.info(
                "%s %s %d %s rid=%s%s",
                request.method,
                request.url.path,
                status,
                f"{(time.perf_counter() - t0) * 1e3:.1f}ms" if t0 is not None else "-",
                rid,
                "".join(f" {name}={digest}" for name, digest in sorted(integrity.items())),
            )

    def endpoint(self, name: str, work: Work) -> Callable[[Request], Awaitable[Response]]:
        """An inference route: admit (see the module docstring), run ``work(request, rid, body)``.

        USG errors propagate to the protocol's exception handlers; anything else is a bug,
        logged with its traceback and answered as a 500 without internal details.
        """

        async def run(request: Request) -> Response:
            rid = request.headers.get("x-request-id") or new_request_id()
            request.state.request_id = rid
            request.state.started = time.perf_counter()
            request.state.endpoint = name
            self.check_state()
            self.authorize(request)
            check_content_length(request, self.limits.max_body_bytes)
            self.gate.check()  # refuse at once when full, without reading the body
            body = await self.receive(request)
            self.gate.acquire()
            streaming = False
            try:
                scope = self.tracing.remote_parent(request.headers) if self.tracing else contextlib.nullcontext()
                with scope:
                    try:
                        response = await _unless_client_leaves(request, work(request, rid, body))
                    except USGError:
                        raise
                    except Exception as exc:
                        log.exception("request %s failed", rid)
                        raise InternalError(f"internal error ({type(exc).__name__})") from exc
                if isinstance(response, EventStreamResponse):  # the slot is held until the stream ends
                    response.on_close(self.gate.release)
                    streaming = True
            finally:
                if not streaming:
                    self.gate.release()
            response.headers["X-Request-Id"] = rid
            self.count(request, None, response.status_code)
            return response

        return run
