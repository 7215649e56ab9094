"""The batch kernel: assemble → pad → call → split → retry → emit events, for items of one model.

Both engines run their batches through it: the in-process
:class:`usg.runtime.batcher.BatchingRunner` (which only queues and schedules) and the Ray
model replica (where ``@serve.batch`` collected the items, :func:`run_items`). So padding,
failure isolation, call deadlines and the :class:`usg.records.BatchEvent` of every backend
call are the same code in both.

Failure isolation. When a batch call fails, every item of it is re-run *alone*, all at once,
on the kernel's retry threads (one per item, up to the model's ``max_size``). The healthy
items are answered after two calls' time (the failed batch, then one round of single-item
calls), and a poison item runs twice. Halving instead (16 → 8 → 4 → 2 → 1, one after the
other) answers them after up to log2(n) + 1 sequential calls and runs the poison item that
many times — with 200 ms calls 1.8 s instead of 0.4 s, and a 6 s hang held the model 30 s.
A single-item round costs about what the batch cost in total compute (n small calls instead of
one of size n); the price is paid only for batches that failed.

Call deadline. With ``call_timeout_s`` (a model's ``options.call_timeout_ms``) a call that
has not returned in time fails its items with a :class:`~usg.errors.BackendError` naming the
model, the deadline and the graph key; a batch that timed out is retried item by item like
any failed batch, so only the hanging item fails. Python cannot stop a thread: the stuck
worker thread runs on until the backend returns, and its result is dropped. The caller's
slot is released at the deadline (``release``), so the model keeps serving other batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor as PoolExecutor
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from usg.backends.base import Backend
from usg.errors import BackendError, USGError
from usg.graph.model import PadPolicy
from usg.graph.state import StateSpec
from usg.records import BatchEvent, ItemTiming
from usg.runtime.cpu_gate import CpuGate
from usg.runtime.padding import assemble, group_key, item_length, item_rows, split_outputs

__all__ = [
    "BatchKernel",
    "ItemsCall",
    "Outcome",
    "call_backend",
    "call_backend_cpu",
    "call_with_deadline",
    "run_items",
]

log = logging.getLogger("usg.runtime.kernel")

#: an item's outputs, or the error that item alone caused (a USGError a backend raised keeps its
#: type, e.g. an InputError stays a 400; anything else becomes a BackendError naming the model)
Outcome = dict[str, Any] | USGError
#: called once per item as soon as its outcome is known: (index, outcome, timing)
Deliver = Callable[[int, Outcome, ItemTiming], None]
#: called once per backend call: (event, indices of the items it ran)
Emit = Callable[[BatchEvent, tuple[int, ...]], None]

_MAX_RETRY_THREADS = 64


@dataclass(frozen=True)
class ItemsCall:
    """One backend call: which items (indices into the list given) it ran, and its event."""

    indices: tuple[int, ...]
    event: BatchEvent


def call_backend(backend: Backend, model: str, batch: Mapping[str, Any]) -> dict[str, Any]:
    """Run one batch, turning unexpected exceptions into BackendError that names the model."""
    try:
        return backend.infer(batch)
    except USGError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in a model: the batch's error
        raise BackendError(f"model {model!r} raised {type(exc).__name__}: {exc}") from exc


def timeout_error(model: str, timeout_s: float, items: int) -> BackendError:
    """The error of a call that ran past ``options.call_timeout_ms``."""
    return BackendError(
        f"model {model!r} did not answer a call of {items} item(s) within call_timeout_ms="
        f"{timeout_s * 1e3:g}; the call was abandoned (its worker thread runs on until the backend "
        f"returns); fix: raise models.{model}.options.call_timeout_ms if the model is only slow, "
        "or find why this input hangs the model"
    )


def call_backend_cpu(backend: Backend, model: str, batch: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
    """:func:`call_backend`, also returning the CPU time (ms) of the calling thread during the call."""
    t0 = time.thread_time()
    out = call_backend(backend, model, batch)
    return out, (time.thread_time() - t0) * 1e3


async def call_with_deadline(
    pool: PoolExecutor | None,
    backend: Backend,
    model: str,
    inputs: Mapping[str, Any],
    timeout_s: float | None,
    call: Callable[[Backend, str, Mapping[str, Any]], Any] = call_backend,
) -> Any:
    """Run ``call`` (one backend call) on ``pool`` (None: the loop's default); past ``timeout_s`` raise."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(pool, call, backend, model, inputs)
    if timeout_s is None:
        return await future
    try:
        return await asyncio.wait_for(future, timeout_s)
    except TimeoutError:
        rows = item_rows(inputs) if inputs else 0
        raise timeout_error(model, timeout_s, rows) from None


class BatchKernel:
    """Runs groups of items (that may share a batch) of one model; see the module docstring."""

    def __init__(
        self,
        model: str,
        backend: Backend,
        pad: PadPolicy | None,
        *,
        pool: PoolExecutor | None = None,
        call_timeout_s: float | None = None,
        max_parallel_retries: int = 8,
        state: StateSpec | None = None,
        gate: CpuGate | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.pad = pad
        #: the executor's cap on CPU-bound calls in flight (usg.runtime.cpu_gate); None: no cap
        self.gate = gate
        #: a stateful model's state: stacked on its batch axis per call, split back per item
        self.state = state
        self.pool = pool
        self.call_timeout_s = call_timeout_s
        self._retry_threads = max(1, min(_MAX_RETRY_THREADS, max_parallel_retries))
        self._retry_pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Let go of the retry threads (a thread stuck in a hung call is not waited for)."""
        if self._retry_pool is not None:
            self._retry_pool.shutdown(wait=False, cancel_futures=True)
            self._retry_pool = None

    async def run(
        self,
        items: Sequence[Mapping[str, Any]],
        waits_ms: Sequence[float],
        deliver: Deliver,
        emit: Emit,
        release: Callable[[], None] | None = None,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Run ``items`` as one call; if it fails, each item alone, all at once.

        ``waits_ms``: each item's wait before this run (for its timing and the events); ``rows``:
        each item's :func:`~usg.runtime.padding.item_rows`, if the caller knows them.
        ``release`` is called once the first call has ended (ok, failed or timed out): the
        single-item retries that may follow run on the kernel's own threads, not in the
        caller's slot.
        """
        start = time.perf_counter()
        indices = tuple(range(len(items)))
        try:
            failed = await self._call(
                items, indices, waits_ms, None, self.pool, deliver, emit, alone=len(items) == 1, rows=rows
            )
        finally:
            if release is not None:
                release()
        if failed is None:
            return
        retry_pool = self._retries()
        await asyncio.gather(
            *(self._call([items[i]], (i,), waits_ms, start, retry_pool, deliver, emit, alone=True) for i in indices)
        )

    def _retries(self) -> ThreadPoolExecutor:
        if self._retry_pool is None:
            self._retry_pool = ThreadPoolExecutor(self._retry_threads, thread_name_prefix=f"usg-retry-{self.model}")
        return self._retry_pool

    async def _call(
        self,
        items: Sequence[Mapping[str, Any]],
        indices: tuple[int, ...],
        waits_ms: Sequence[float],
        start: float | None,
        pool: PoolExecutor | None,
        deliver: Deliver,
        emit: Emit,
        *,
        alone: bool = False,
        rows: Sequence[int] | None = None,
    ) -> USGError | None:
        """One backend call over ``items``; delivers on success (and, ``alone``, on failure).

        ``start``: when the first call of a retry began (its time counts as the item's wait).
        Returns the error of a failed call that was not delivered, else None."""
        if self.gate is None or not self.gate.applies(self.backend):
            return await self._call_now(items, indices, waits_ms, start, pool, deliver, emit, None, alone, rows)
        queued = time.perf_counter()
        async with self.gate.hold(self.backend, self.model):  # waiting for a core is queueing, not compute
            return await self._call_now(items, indices, waits_ms, start, pool, deliver, emit, queued, alone, rows)

    async def _call_now(
        self,
        items: Sequence[Mapping[str, Any]],
        indices: tuple[int, ...],
        waits_ms: Sequence[float],
        start: float | None,
        pool: PoolExecutor | None,
        deliver: Deliver,
        emit: Emit,
        queued: float | None,
        alone: bool,
        rows: Sequence[int] | None = None,
    ) -> USGError | None:
        t0 = time.perf_counter()
        since_t = start if start is not None else queued  # a retry's first start, else the gate wait
        since = 0.0 if since_t is None else (t0 - since_t) * 1e3
        waits = tuple(waits_ms[i] + since for i in indices)
        real = padded = 0
        if rows is None:
            rows = [item_rows(it, self.state) for it in items]
        try:
            inputs, real, padded = assemble(items, self.pad, self.state)
            out, cpu_ms = await call_with_deadline(
                pool, self.backend, self.model, inputs, self.call_timeout_s, call_backend_cpu
            )
            parts = split_outputs(out, items, self.pad, inputs, self.state, rows)
        except Exception as exc:
            compute_ms = (time.perf_counter() - t0) * 1e3
            emit(self._event(items, sum(rows), real, padded, waits, compute_ms, ok=False), indices)
            error = exc if isinstance(exc, USGError) else BackendError(f"model {self.model!r}: {exc}")
            if alone:
                deliver(indices[0], error, ItemTiming(waits[0], compute_ms, 1))
                return None
            return error
        compute_ms = (time.perf_counter() - t0) * 1e3
        cpu = cpu_ms if self.backend.cpu_in_caller else None
        emit(self._event(items, sum(rows), real, padded, waits, compute_ms, ok=True, cpu_ms=cpu), indices)
        size = len(items)
        for i, wait, part in zip(indices, waits, parts, strict=True):
            deliver(i, part, ItemTiming(wait, compute_ms, size))
        return None

    def _event(
        self,
        items: Sequence[Mapping[str, Any]],
        rows: int,
        real: int,
        padded: int,
        waits: tuple[float, ...],
        compute_ms: float,
        *,
        ok: bool,
        cpu_ms: float | None = None,
    ) -> BatchEvent:
        return BatchEvent(self.model, len(items), rows, real, padded, waits, compute_ms, ok, cpu_ms)


def group_indices(items: Sequence[Mapping[str, Any]], pad: PadPolicy | None) -> list[list[int]]:
    """Indices of ``items`` grouped by what may share a batch, each group ordered by length."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in sorted(range(len(items)), key=lambda i: item_length(items[i], pad)):
        groups.setdefault(group_key(items[i], pad), []).append(i)
    return list(groups.values())


async def run_items(
    kernel: BatchKernel, items: Sequence[Mapping[str, Any]], queue_ms: Sequence[float] | None = None
) -> tuple[list[Outcome], list[ItemsCall]]:
    """Run items that something else collected (Ray Serve's ``@serve.batch``) as few calls as
    their shapes allow: per item its outputs or its own BackendError (input order), and the
    backend calls made. ``queue_ms``: each item's wait before this run."""
    results: list[Outcome] = [BackendError(f"model {kernel.model!r}: item not run")] * len(items)
    waits = list(queue_ms) if queue_ms is not None else [0.0] * len(items)
    calls: list[ItemsCall] = []
    for idx in group_indices(items, kernel.pad):

        def deliver(j: int, outcome: Outcome, timing: ItemTiming, idx: list[int] = idx) -> None:
            results[idx[j]] = outcome

        def emit(event: BatchEvent, js: tuple[int, ...], idx: list[int] = idx) -> None:
            calls.append(ItemsCall(tuple(idx[j] for j in js), event))

        await kernel.run([items[i] for i in idx], [waits[i] for i in idx], deliver, emit)
    return results, calls
