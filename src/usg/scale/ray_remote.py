"""The router's side of a remote model or node: a USG Backend / callable over a DeploymentHandle.

The executor in the router treats these like local ones (contract checks, pruning, map
fan-out, gather are its own code); only the call crosses to another replica, a map node's
items in one call. Arguments travel pickled, never as JSON: small payloads over Ray Serve's
gRPC transport, large ones as Ray objects (numpy arrays through the object store, read
zero-copy) — see :mod:`usg.scale.transport`. A call that fails because its replica died or
is unreachable is retried on another replica (model calls and node functions are
idempotent); when retries run out the request fails with
:class:`usg.errors.ReplicaUnavailable` (HTTP 503), never silently. The batches a model's
replicas ran come back with the replies and go to the executor's observers. An engine model
(``backend: openai``) in its own deployment streams: :meth:`RayModelBackend.astream` iterates
the replica's ``generate`` through a streaming handle, passing each token delta on as it arrives
(retried on another replica only before the first one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from usg.backends.base import BackendState, DeclaredSpecsBackend
from usg.errors import BackendError, ReplicaUnavailable, USGError
from usg.records import EngineCall, ItemTiming
from usg.scale.reply import ReplicaReply
from usg.scale.transport import Transport

__all__ = ["RayFn", "RayModelBackend", "replica_failure_types"]

log = logging.getLogger("usg.scale.ray")
# Serve replaces a dead replica within seconds; keep retrying (backing off to 1 s) for this long
# — the request's own deadline still applies, it cancels the wait
_RETRY_WINDOW_S = 20.0
# while the router waits for a model's contracts at start, how often it checks the deployment failed
_SPECS_POLL_S = 1.0


def _backoffs() -> Iterator[float]:
    """Sleep before each retry, until the retry window is spent."""
    spent, step = 0.0, 0.1
    while spent < _RETRY_WINDOW_S:
        yield step
        spent += step
        step = min(1.0, step * 2)


def replica_failure_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this replica could not run the call", not "the call failed"."""
    import ray.exceptions as rx

    kinds: list[type[BaseException]] = [rx.RayActorError, rx.ActorUnavailableError]
    try:  # the gRPC transport's own failures (Serve maps UNAVAILABLE to ActorUnavailableError)
        import grpc

        kinds.append(grpc.aio.AioRpcError)
    except ImportError:
        pass
    try:
        from ray.serve.exceptions import DeploymentUnavailableError

        kinds.append(DeploymentUnavailableError)
    except ImportError:  # older Ray
        pass
    return tuple(kinds)


def _unwrap(value: Any) -> Any:
    if isinstance(value, USGError):
        raise value
    return value


class _Retry:
    """Retry a call whose replica failed, backing off, for the retry window; then ReplicaUnavailable."""

    def __init__(self, what: str, target: str) -> None:
        self.what = what  # "model 'det'", for messages
        self.target = target  # "model-det", the deployment, for the retries counter
        self.on_retry: Callable[[str], None] | None = None
        self.failures = replica_failure_types()

    def _failed(self, exc: BaseException, attempts: int, pause: float | None) -> float:
        if pause is None:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ReplicaUnavailable(
                f"{self.what}: its Ray Serve replicas failed {attempts} call(s) in a row "
                f"({type(exc).__name__}: {first}); "
                "fix: retry the request; check `serve status` and the replica logs (out of memory? crash?)"
            ) from exc
        log.warning("%s: replica call failed (%s); retry %d", self.what, type(exc).__name__, attempts)
        if self.on_retry is not None:
            self.on_retry(self.target)
        return pause

    def sync(self, call: Callable[[], Any]) -> Any:
        for attempts, pause in enumerate((*_backoffs(), None), start=1):
            try:
                return _unwrap(call())
            except self.failures as exc:
                time.sleep(self._failed(exc, attempts, pause))
        raise AssertionError("unreachable")

    async def run(self, call: Callable[[], Awaitable[Any]]) -> Any:
        for attempts, pause in enumerate((*_backoffs(), None), start=1):
            try:
                return _unwrap(await call())
            except self.failures as exc:
                await asyncio.sleep(self._failed(exc, attempts, pause))
        raise AssertionError("unreachable")


class RayModelBackend(DeclaredSpecsBackend):
    """A graph model served by a Ray Serve deployment (``ModelReplica``).

    One item is one call; a map node's items go in one call (:meth:`ainfer_many`), and the
    replica feeds them to its batcher one by one, so they still batch with other requests'.
    """

    kind = "ray-serve"
    remote = True
    ships_derived = True  # a derived input travels as its function and source (usg.ops.wire)

    def __init__(self, model: str, handle: Any, *, batching: bool = False, engine: bool = False) -> None:
        super().__init__()  # the contracts come from the deployment at load()
        self.model = model
        self.handle = handle
        self.remote_batching = batching  # the replicas batch (@serve.batch) and report each batch
        self.engine = engine  # a generation engine's client (backend: openai): called through generate
        self.retry = _Retry(f"model {model!r}", f"model-{model}")
        self.transport = Transport(f"model-{model}", handle)
        self.transport_many = Transport(f"model-{model}", handle, "many")

    def _outputs(self, reply: ReplicaReply, timing: ItemTiming | None = None) -> dict[str, Any]:
        for event in reply.batches:
            for listener in self.batch_listeners:
                listener(event)
        if timing is not None:
            timing.compute_ms = reply.compute_ms
            timing.batch_size = reply.batch_size
        out: dict[str, Any] = _unwrap(reply.outputs)
        return out

    def load(self) -> None:
        """Ask the deployment for its model's contracts (called in a worker thread at start).

        Waits as long as the model's replicas take to load, but not for a deployment Serve gave
        up on or an application being deleted: the wait would hold this router replica's start
        until Serve's graceful-shutdown timeout (20 s) kills it."""
        self._in, self._out = self.retry.sync(self._specs)
        self.state = BackendState.LOADED

    def _specs(self) -> Any:
        response = self.handle.specs.remote()
        while True:
            try:
                return response.result(timeout_s=_SPECS_POLL_S)
            except TimeoutError:
                why = self.start_failure()
                if why is not None:
                    raise BackendError(
                        f"model {self.model!r}: the router cannot read its contracts: {why}; "
                        "fix: the model deployment's own error is in `serve status` and its replica logs"
                    ) from None

    def start_failure(self) -> str | None:
        """Why the model's deployment will never answer (see ray_rollout.deployment_failure)."""
        from ray import serve

        from usg.scale.ray_rollout import deployment_failure

        return deployment_failure(self.handle.app_name, self.handle.deployment_name, serve.status)

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        item = dict(inputs)
        handle, via, size = self.transport.pick(item)
        self.transport.count("request", via, size)
        reply: ReplicaReply = self.retry.sync(lambda: handle.remote(item).result())
        self.transport.count_reply(via, reply.outputs)
        return self._outputs(reply)

    async def ainfer(self, inputs: Mapping[str, Any], timing: ItemTiming | None = None) -> dict[str, Any]:
        if self.engine:
            return await self._generate(inputs, None, timing)
        item = dict(inputs)
        handle, via, size = self.transport.pick(item)
        self.transport.count("request", via, size)
        reply: ReplicaReply = await self.retry.run(lambda: handle.remote(item))
        self.transport.count_reply(via, reply.outputs)
        return self._outputs(reply, timing)

    async def astream(
        self, inputs: Mapping[str, Any], on_token: Callable[[str], None], timing: ItemTiming | None = None
    ) -> dict[str, Any]:
        if not self.engine:
            return await self.ainfer(inputs, timing)
        return await self._generate(inputs, on_token, timing)

    async def _generate(
        self, inputs: Mapping[str, Any], on_token: Callable[[str], None] | None, timing: ItemTiming | None
    ) -> dict[str, Any]:
        """One engine-model item through the replica's streaming ``generate``; leaving early (the
        request was cancelled) cancels the replica's generator, and with it the engine request."""
        item = dict(inputs)
        sent = 0

        async def call() -> ReplicaReply:
            nonlocal sent
            pieces = self.handle.options(stream=True).generate.remote(item, on_token is not None)
            reply: ReplicaReply | None = None
            try:
                async for piece in pieces:
                    if isinstance(piece, ReplicaReply):
                        reply = piece
                    elif on_token is not None:
                        sent += 1
                        on_token(piece)
            except self.retry.failures as exc:
                if sent:  # its tokens reached the client: another replica would send them again
                    raise ReplicaUnavailable(
                        f"model {self.model!r}: its Ray Serve replica failed after streaming {sent} token deltas "
                        f"({type(exc).__name__}); fix: retry the request; check `serve status` and the replica logs"
                    ) from exc
                raise
            finally:
                if reply is None:
                    pieces.cancel()
            if reply is None:
                raise BackendError(f"model {self.model!r}: its replica's stream ended without a reply")
            return reply

        reply = await self.retry.run(call)
        if timing is not None and reply.engine_calls:
            shift = time.perf_counter() - reply.clock  # the replica's clock onto this process's
            timing.engine_calls.extend(_shifted(c, shift) for c in reply.engine_calls)
        return self._outputs(reply, timing)

    async def ainfer_many(
        self, items: Sequence[Mapping[str, Any]], timings: Sequence[ItemTiming | None]
    ) -> list[dict[str, Any]]:
        """A map node's items in one call; the first failing item's error is raised."""
        batch = [dict(it) for it in items]
        if self.transport_many.by_reference is None:  # a handle without the method: one call each
            return list(await asyncio.gather(*(self.ainfer(it, t) for it, t in zip(batch, timings, strict=True))))
        if not batch:
            return []
        handle, via, size = self.transport_many.pick(batch)
        self.transport_many.count("request", via, size)
        replies: list[ReplicaReply] = await self.retry.run(lambda: handle.remote(batch))
        self.transport_many.count_reply(via, [r.outputs for r in replies])
        return [self._outputs(r, t) for r, t in zip(replies, timings, strict=True)]

    @property
    def description(self) -> str:
        return f"ray-serve deployment of model {self.model!r}"


def _shifted(call: EngineCall, shift: float) -> EngineCall:
    first = call.first_token + shift if call.first_token is not None else None
    return dataclasses.replace(call, start=call.start + shift, end=call.end + shift, first_token=first)


class RayFn:
    """A Python node run by its own deployment (``FnReplica``); called in an executor worker thread."""

    def __init__(self, node: str, handle: Any) -> None:
        self.node = node
        self.handle = handle
        self.retry = _Retry(f"node {node!r}", f"node-{node}")
        self.transport = Transport(f"node-{node}", handle)

    def __call__(self, **kwargs: Any) -> Any:
        handle, via, size = self.transport.pick(kwargs)
        self.transport.count("request", via, size)
        out = self.retry.sync(lambda: handle.remote(kwargs).result())
        self.transport.count_reply(via, out)
        return out
