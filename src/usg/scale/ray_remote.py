"""The router's side of a remote model or node: a USG Backend / callable over a DeploymentHandle.

The executor in the router treats these like local ones (contract checks, pruning, map
fan-out, gather are its own code); only the call crosses to another replica. Arguments
travel as Ray objects (numpy arrays through the object store, zero-copy where Ray can), not
JSON. A call that fails because its replica died or is unreachable is retried on another
replica (model calls and node functions are idempotent); when retries run out the request
fails with :class:`usg.errors.ReplicaUnavailable` (HTTP 503), never silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from usg.backends.base import BackendState, DeclaredSpecsBackend
from usg.errors import ReplicaUnavailable, USGError

__all__ = ["RayFn", "RayModelBackend", "replica_failure_types"]

log = logging.getLogger("usg.scale.ray")
# Serve replaces a dead replica within seconds; keep retrying (backing off to 1 s) for this long
# — the request's own deadline still applies, it cancels the wait
_RETRY_WINDOW_S = 20.0


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


def _give_up(what: str, attempts: int, exc: BaseException) -> ReplicaUnavailable:
    return ReplicaUnavailable(
        f"{what}: its Ray Serve replicas failed {attempts} call(s) in a row "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
        "fix: retry the request; check `serve status` and the replica logs (out of memory? crash?)"
    )


class RayModelBackend(DeclaredSpecsBackend):
    """A graph model served by a Ray Serve deployment (``ModelReplica``)."""

    kind = "ray-serve"
    remote = True

    def __init__(self, model: str, handle: Any, on_retry: Callable[[str], None] | None = None) -> None:
        super().__init__()  # the contracts come from the deployment at load()
        self.model = model
        self.handle = handle
        self.on_retry = on_retry
        self._failures = replica_failure_types()

    def load(self) -> None:
        """Ask the deployment for its model's contracts (called in a worker thread at start)."""
        for attempts, pause in enumerate((*_backoffs(), None), start=1):
            try:
                self._in, self._out = self.handle.specs.remote().result()
                self.state = BackendState.LOADED
                return
            except self._failures as exc:
                if pause is None:
                    raise _give_up(f"model {self.model!r}", attempts, exc) from exc
                time.sleep(pause)

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _unwrap(self.handle.remote(dict(inputs)).result())
        return out

    async def ainfer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        item = dict(inputs)
        for attempts, pause in enumerate((*_backoffs(), None), start=1):
            try:
                out: dict[str, Any] = _unwrap(await self.handle.remote(item))
                return out
            except self._failures as exc:
                if pause is None:
                    raise _give_up(f"model {self.model!r}", attempts, exc) from exc
                log.warning("model %s: replica call failed (%s); retry %d", self.model, type(exc).__name__, attempts)
                if self.on_retry is not None:
                    self.on_retry(f"model-{self.model}")
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    @property
    def description(self) -> str:
        return f"ray-serve deployment of model {self.model!r}"


class RayFn:
    """A Python node run by its own deployment (``FnReplica``); called in an executor worker thread."""

    def __init__(self, node: str, handle: Any, on_retry: Callable[[str], None] | None = None) -> None:
        self.node = node
        self.handle = handle
        self.on_retry = on_retry
        self._failures = replica_failure_types()

    def __call__(self, **kwargs: Any) -> Any:
        for attempts, pause in enumerate((*_backoffs(), None), start=1):
            try:
                return _unwrap(self.handle.remote(kwargs).result())
            except self._failures as exc:
                if pause is None:
                    raise _give_up(f"node {self.node!r}", attempts, exc) from exc
                log.warning("node %s: replica call failed (%s); retry %d", self.node, type(exc).__name__, attempts)
                if self.on_retry is not None:
                    self.on_retry(f"node-{self.node}")
                time.sleep(pause)
        raise AssertionError("unreachable")
