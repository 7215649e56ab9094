"""Model runners: how the executor hands one item to a model.

An *item* is a dict of port → array whose axis 0 is a (usually size-1) batch axis,
or a list of strings for text ports. :class:`DirectRunner` runs each item as its
own backend call; the batching runner (``usg.runtime.batcher``) groups items
from many nodes and requests into one call. Both expose the same ``submit``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor as PoolExecutor
from typing import Any, Protocol

from usg.backends import create_backend
from usg.backends.base import Backend
from usg.graph.model import ModelDef
from usg.records import ItemTiming
from usg.runtime.cpu_gate import CpuGate
from usg.runtime.kernel import call_backend, call_with_deadline

__all__ = ["DirectRunner", "ItemTiming", "ModelRunner", "backend_for", "concurrency_for"]


def backend_for(model: ModelDef) -> Backend:
    """The (not yet loaded) backend a graph's model declares."""
    return create_backend(model.backend, model.path, model.options, name=model.name)


def concurrency_for(model: ModelDef, backend: Backend) -> int:
    """Calls of ``model`` in flight at once: ``options.concurrency``, else the backend's default."""
    return model.concurrency if "concurrency" in model.options else max(1, backend.default_concurrency)


class ModelRunner(Protocol):
    model: str

    @property
    def batches(self) -> bool:
        """Whether calls are batched (their queue and compute figures come from batch events)."""
        ...

    async def start(self) -> None: ...

    async def submit(
        self,
        item: Mapping[str, Any],
        timing: ItemTiming | None = None,
        on_token: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one item; ``on_token`` gets the text a generation engine streams for it (if any)."""
        ...

    async def submit_many(
        self, items: Sequence[Mapping[str, Any]], timings: Sequence[ItemTiming | None]
    ) -> list[dict[str, Any]]:
        """Submit one request's fan-out (a map node's items), admitted as a whole."""
        ...

    async def stop(self) -> None: ...


class DirectRunner:
    """One backend call per item, at most ``concurrency`` at a time (like one Triton instance).

    With ``gate`` a single-threaded CPU call also waits for a core (:mod:`usg.runtime.cpu_gate`).
    With ``call_timeout_s`` a call past the deadline fails (and frees its slot) with a
    BackendError; see :mod:`usg.runtime.kernel`. A remote backend (``backend.remote``) is
    awaited directly with no local cap: the remote deployment queues, batches and pushes back.
    """

    def __init__(
        self,
        model: str,
        backend: Backend,
        pool: PoolExecutor,
        *,
        concurrency: int = 1,
        call_timeout_s: float | None = None,
        gate: CpuGate | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.pool = pool
        self.call_timeout_s = call_timeout_s
        self._sem = asyncio.Semaphore(max(1, concurrency))
        self._gate = gate or CpuGate(0)  # the executor's cap on CPU-bound calls in flight

    @property
    def batches(self) -> bool:
        """Whether this model's calls are batched (here never; remotely when the backend says so)."""
        return self.backend.remote_batching

    async def start(self) -> None:
        return None

    async def submit(
        self,
        item: Mapping[str, Any],
        timing: ItemTiming | None = None,
        on_token: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.backend.remote:
            far = ItemTiming(compute_ms=-1.0)
            try:
                if on_token is not None:
                    out = await self.backend.astream(item, on_token, far)
                else:
                    out = await self.backend.ainfer(item, far)
            finally:
                if timing is not None:  # a failed engine call is still reported
                    timing.engine_calls.extend(far.engine_calls)
            if timing is None:
                return out
            round_trip = (time.perf_counter() - t0) * 1e3
            if far.compute_ms < 0:  # the backend does not say: the round trip counts as compute
                timing.compute_ms = round_trip
            else:  # the hop and the far side's queue are waiting; compute is the model's own
                timing.compute_ms = min(far.compute_ms, round_trip)
                timing.queue_ms = round_trip - timing.compute_ms
                timing.batch_size = far.batch_size
            return out
        async with self._sem, self._gate.hold(self.backend, self.model):
            t1 = time.perf_counter()
            if self.backend.runs_inline(item):
                out = call_backend(self.backend, self.model, item)
            else:
                out = await call_with_deadline(self.pool, self.backend, self.model, item, self.call_timeout_s)
        if timing is not None:
            timing.queue_ms = (t1 - t0) * 1e3
            timing.compute_ms = (time.perf_counter() - t1) * 1e3
        return out

    async def submit_many(
        self, items: Sequence[Mapping[str, Any]], timings: Sequence[ItemTiming | None]
    ) -> list[dict[str, Any]]:
        many = getattr(self.backend, "ainfer_many", None) if self.backend.remote else None
        if many is not None and len(items) > 1:  # a remote deployment takes the fan-out in one hop
            t0 = time.perf_counter()
            outs: list[dict[str, Any]] = await many(items, timings)
            round_trip = (time.perf_counter() - t0) * 1e3
            for t in timings:
                if t is not None:
                    t.compute_ms = min(t.compute_ms, round_trip)
                    t.queue_ms = round_trip - t.compute_ms
            return outs
        return list(await asyncio.gather(*(self.submit(it, t) for it, t in zip(items, timings, strict=True))))

    async def stop(self) -> None:
        return None
