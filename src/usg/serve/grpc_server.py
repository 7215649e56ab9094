"""Open Inference Protocol v2 over gRPC: Triton's ``inference.GRPCInferenceService`` beside the HTTP app.

``usg serve GRAPH --grpc-port N`` runs this service on grpcio's asyncio server, in the same
process and event loop as uvicorn and over the same :class:`~usg.serve.app.ServeContext`
(executor, in-flight gate, state, metrics). It answers ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelInfer and ModelStreamInfer with the stubs ``tritonclient``
ships (the other RPCs of the service answer UNIMPLEMENTED). Tensors follow the HTTP v2
endpoint's rules (:mod:`usg.serve.grpc_codec`). Errors map to status codes by what the
caller can do::

    InputError (bad input, above a limit)   INVALID_ARGUMENT    names the field and the fix
    Overloaded (in-flight gate, full queue) RESOURCE_EXHAUSTED  says when to retry (trailer retry-after)
    DrainingError, StateError               UNAVAILABLE         starting or shutting down: use another replica
    ModelNotFound                           NOT_FOUND
    Unauthenticated                         UNAUTHENTICATED     an API key is set and the call lacks it
    RequestTimeout                          DEADLINE_EXCEEDED
    anything else                           INTERNAL            details in the server log, not in the reply

At most half of the calls grpc takes at once (``maximum_concurrent_rpcs``) may be open
ModelStreamInfer streams; more are refused with RESOURCE_EXHAUSTED, so streams a client opens
and leaves idle never take the slots of ModelInfer and health checks.
A message above the body limit (``--max-body-mb``) is refused by grpc itself, with
RESOURCE_EXHAUSTED, before it is held in memory. With an API key, ModelInfer,
ModelStreamInfer and the metadata RPCs need the metadata ``authorization: Bearer KEY`` (as
the HTTP routes need the header); health (ServerLive, ServerReady, ModelReady) stays open.
On shutdown the service keeps answering (UNAVAILABLE to new calls) until the requests in
flight on either port are done, then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import math
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from usg.errors import (
    InputError,
    MissingDependency,
    Overloaded,
    RequestTimeout,
    StateError,
    USGError,
)

try:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
except ImportError as _exc:  # pragma: no cover - depends on the environment
    _missing = "grpcio" if _exc.name in (None, "grpc") else _exc.name.split(".")[0]
    raise MissingDependency(_missing, "grpc", "usg serve --grpc-port") from None

from prometheus_client import Counter, Gauge

from usg import __version__
from usg.serve.app import ServeState
from usg.serve.context import new_request_id
from usg.serve.errors import DrainingError, ModelNotFound, rejection_reason
from usg.serve.grpc_codec import build_response, metadata_response, parse_infer_request, requested_outputs
from usg.serve.oip import check_model

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from usg.serve.app import ServeContext

__all__ = ["InferenceService", "Unauthenticated", "attach_grpc", "grpc_serving", "hold_grpc_port"]

log = logging.getLogger("usg.serve.grpc")

_SERVICE = "inference.GRPCInferenceService"


class Unauthenticated(USGError):
    """The server has an API key and the call did not carry it."""

    status = 401
    reason = "unauthenticated"


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status of an error (see the module docstring)."""
    if isinstance(exc, InputError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, StateError):  # DrainingError, still loading, ReplicaUnavailable
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, ModelNotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(exc, RequestTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.INTERNAL


def _failure(exc: Exception, request_id: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(status, details, trailing metadata) of a failed call; unexpected errors are logged, not sent."""
    trailers: tuple[tuple[str, str], ...] = (("x-request-id", request_id),)
    if not isinstance(exc, USGError):
        log.error("gRPC request %s failed", request_id, exc_info=exc)
        return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log", trailers
    if isinstance(exc, Overloaded):
        trailers += (("retry-after", str(max(1, math.ceil(exc.retry_after)))),)
    code = status_code(exc)
    if code is grpc.StatusCode.INTERNAL:  # a model or node failed: its message may carry library paths
        log.error("gRPC request %s failed: %s", request_id, exc)
        return code, f"internal error ({exc.reason}); details in the server log, request id {request_id}", trailers
    return code, str(exc), trailers


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs over one :class:`ServeContext`; ``api_key`` (None: open) guards inference and metadata."""

    def __init__(self, ctx: ServeContext, *, api_key: str | None = None, max_calls: int | None = None) -> None:
        self.ctx = ctx
        #: calls grpc takes at once; streams may hold half of them (each holds its slot while open)
        self.max_calls = max_calls if max_calls is not None else default_max_calls(ctx)
        self.max_streams = max(1, self.max_calls // 2)
        self.streams = 0
        self.graph = ctx.graph
        self._key = None if api_key is None else api_key.encode()
        self._model_metadata: pb.ModelMetadataResponse | None = None  # built on first use (reads model files)
        self.calls = Counter(
            "usg_grpc_requests",
            "gRPC inference calls (stream: per message) by method and status code.",
            ["method", "code"],
            registry=ctx.metrics.registry,
        )
        Gauge(
            "usg_grpc_streams",
            "ModelStreamInfer streams open (each holds a gRPC call slot; at most half of them).",
            registry=ctx.metrics.registry,
        ).set_function(lambda: float(self.streams))

    # -- health (open) and metadata (behind the API key, if any) ------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ctx.ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        await self._authorized(context, "ServerMetadata")
        return pb.ServerMetadataResponse(name="usg", version=__version__, extensions=[])

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            check_model(self.graph, request.name, request.version)
        except ModelNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return pb.ModelReadyResponse(ready=self.ctx.ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        await self._authorized(context, "ModelMetadata")
        try:
            check_model(self.graph, request.name, request.version)
        except ModelNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        if self._model_metadata is None:
            self._model_metadata = metadata_response(self.graph)
        return self._model_metadata

    # -- inference -----------------------------------------------------------------------------
    def _authorize(self, metadata: dict[str, str]) -> None:
        if self._key is None:
            return
        sent = metadata.get("authorization", "")
        scheme, _, given = sent.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._key):
            what = (
                "the authorization metadata does not carry the server's API key"
                if sent
                else "no authorization metadata"
            )
            raise Unauthenticated(
                what + "; fix: send the metadata 'authorization: Bearer <key>' with the key the server was started "
                "with (tritonclient.grpc: headers={'authorization': 'Bearer <key>'})"
            )

    async def _authorized(self, context: Any, method: str) -> dict[str, str]:
        """The call's metadata, or the call ends UNAUTHENTICATED."""
        metadata = _metadata(context)
        try:
            self._authorize(metadata)
        except Unauthenticated as exc:
            self._count(method, exc)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        return metadata

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """The HTTP routes' admission: ready state, then a slot of the shared in-flight gate."""
        state = self.ctx.state
        if state is not ServeState.READY:
            if state is ServeState.STARTING:
                raise StateError("the server is still loading models; fix: wait until ServerReady is true")
            raise DrainingError(
                "the server is shutting down and accepts no new requests; fix: retry on another replica"
            )
        self.ctx.gate.acquire()
        try:
            yield
        finally:
            self.ctx.gate.release()

    async def _infer(
        self, request: pb.ModelInferRequest, request_id: str, metadata: dict[str, str]
    ) -> pb.ModelInferResponse:
        graph = self.graph
        with self._admitted():
            check_model(graph, request.model_name, request.model_version)
            raw = parse_infer_request(graph, request)
            names = requested_outputs(graph, request)
            tracing = self.ctx.tracing
            with tracing.remote_parent(metadata) if tracing is not None else contextlib.nullcontext():
                result = await self.ctx.infer(raw, request_id)
            return build_response(graph, request_id, request.id, result, names)

    def _count(self, method: str, exc: Exception | None) -> None:
        code = grpc.StatusCode.OK if exc is None else status_code(exc)
        if isinstance(exc, USGError):
            reason = rejection_reason(exc)
            if reason is not None:
                self.ctx.metrics.reject(reason)
        self.calls.labels(method, code.name).inc()

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        metadata = await self._authorized(context, "ModelInfer")
        rid = metadata.get("x-request-id") or new_request_id()
        try:
            response = await self._infer(request, rid, metadata)
        except Exception as exc:
            self._count("ModelInfer", exc)
            code, details, trailers = _failure(exc, rid)
            await context.abort(code, details, trailing_metadata=trailers)
        self._count("ModelInfer", None)
        return response

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each message is answered on the stream (an error as ``error_message``, the stream stays
        open); messages run concurrently, at most ``--max-inflight`` of a stream unanswered at once."""
        metadata = await self._authorized(context, "ModelStreamInfer")
        if self.streams >= self.max_streams:
            exc = Overloaded(
                f"{self.streams} ModelStreamInfer streams are open (limit {self.max_streams}: half of the "
                f"{self.max_calls} calls the server takes at once, so unary calls and health checks keep the "
                "rest); fix: send more messages on an open stream, close idle ones, or raise --max-inflight",
                why="grpc_streams",
            )
            self._count("ModelStreamInfer", exc)
            code, details, trailers = _failure(exc, new_request_id())
            await context.abort(code, details, trailing_metadata=trailers)
        self.streams += 1
        try:
            async for reply in self._stream(request_iterator, metadata):
                yield reply
        finally:
            self.streams -= 1

    async def _stream(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], metadata: dict[str, str]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        replies: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        window = asyncio.Semaphore(self.ctx.config.max_inflight)  # bounds replies waiting to be sent
        tasks: set[asyncio.Task[None]] = set()
        # the stream's x-request-id, numbered per message (its messages run at once: one id each)
        base = metadata.get("x-request-id")
        count = itertools.count(1)

        async def answer(request: pb.ModelInferRequest) -> None:
            rid = f"{base}.{next(count)}" if base else new_request_id()
            try:
                reply = pb.ModelStreamInferResponse(infer_response=await self._infer(request, rid, metadata))
                self._count("ModelStreamInfer", None)
            except Exception as exc:
                self._count("ModelStreamInfer", exc)
                code, details, _ = _failure(exc, rid)
                echo = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
                reply = pb.ModelStreamInferResponse(error_message=f"{code.name}: {details}", infer_response=echo)
            replies.put_nowait(reply)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await window.acquire()
                    task = asyncio.create_task(answer(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
            finally:
                replies.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                window.release()
                yield reply
            await reader  # re-raise a failure of the request stream
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()


def default_max_calls(ctx: ServeContext) -> int:
    """Calls open at once by default: twice ``--max-inflight`` plus 16."""
    return 2 * ctx.config.max_inflight + 16


def hold_grpc_port(host: str, port: int) -> socket.socket:
    """Bind ``--grpc-port`` before the models load and keep it bound (not listening) until grpc
    listens on it (:func:`grpc_serving` closes it then): a busy port fails at once (grpc would only
    fail after the models loaded), and nothing started in between — Ray's processes under
    ``--engine ray`` pick free ports while the models load — is handed this port by the kernel
    (automatic port choice skips bound ports). Both sockets set SO_REUSEADDR, so grpc may bind beside
    it while neither listens; a listener elsewhere refuses both."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc: TIME_WAIT is free, a listener is not
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        raise USGError(
            f"--grpc-port {port}: cannot listen on {host}:{port} ({exc.strerror}); "
            "fix: stop the process that uses the port, or pick another --grpc-port"
        ) from None
    return s


@contextlib.asynccontextmanager
async def grpc_serving(
    ctx: ServeContext,
    host: str,
    port: int,
    *,
    api_key: str | None = None,
    max_calls: int | None = None,
    held: socket.socket | None = None,
) -> AsyncIterator[int]:
    """Run the service on ``host:port`` (on the running event loop) while inside; yields the bound port.

    Messages are limited to the body limit (``ctx.config.max_body_bytes``), and calls open at
    once to ``max_calls`` (default twice ``--max-inflight`` plus 16; grpc refuses more with
    RESOURCE_EXHAUSTED before reading their message), so received messages are bounded by
    their product. ModelStreamInfer streams hold their slot while open, so at most half of the
    slots may be streams (more: RESOURCE_EXHAUSTED naming the limit): idle streams cannot lock
    out ModelInfer and the health RPCs. ``held`` (from :func:`hold_grpc_port`) is closed once grpc listens, or on a
    failure to start. On exit the context drains (new calls: UNAVAILABLE) until no request is in
    flight, then the server stops.
    """
    max_calls = max_calls if max_calls is not None else default_max_calls(ctx)
    server = grpc.aio.server(
        maximum_concurrent_rpcs=max_calls,
        options=[
            ("grpc.max_receive_message_length", ctx.limits.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
        ],
    )
    service = InferenceService(ctx, api_key=api_key, max_calls=max_calls)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise USGError(
                f"--grpc-port {port}: cannot listen on {address} ({exc}); fix: pick another --grpc-port"
            ) from None
        await server.start()
    finally:
        if held is not None:
            held.close()  # grpc listens on the port now (or failed to): ours is no longer needed
    log.info("gRPC %s on %s", _SERVICE, address)
    try:
        yield bound
    finally:
        ctx.begin_draining()
        deadline = time.monotonic() + ctx.config.drain_timeout_s
        while ctx.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await server.stop(grace=1.0)  # sends the last replies; open streams end


def attach_grpc(
    app: Starlette, host: str, port: int, *, api_key: str | None = None, held: socket.socket | None = None
) -> None:
    """Serve gRPC beside an app of :func:`~usg.serve.create_app` (same context and event loop):
    it starts after the models have loaded and stops, drained, before the executor closes.
    ``held``: the port's socket from :func:`hold_grpc_port`, closed once grpc listens."""
    ctx = app.state.usg
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Starlette) -> AsyncIterator[None]:
        async with inner(a), grpc_serving(ctx, host, port, api_key=api_key, held=held):
            yield

    app.router.lifespan_context = lifespan
