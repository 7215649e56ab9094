"""Per-model dynamic batching, shared by every node (and request) that calls the model.

Items wait in a bounded queue. A scheduler forms batches when ``max_size``
items are waiting or the oldest has waited the (adaptive) delay — or, with ``batch.adaptive``,
the cap and wait the :class:`~usg.runtime.controller.BatchController` chose from the calls it is
fed: it orders
waiting items by length, groups items that may share a batch — equal shapes,
or, for models declared pad-safe, equal shapes outside the padded axes — pads
variable axes to a multiple or bucket, respects a padded-element budget
(``max_tokens`` / ``max_pixels``) and preferred batch sizes, and hands each batch to the
:class:`~usg.runtime.kernel.BatchKernel` (pad, call on a worker thread, split, retry the
items of a failed batch alone, emit events), at most ``concurrency`` batches at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor as PoolExecutor
from dataclasses import dataclass
from typing import Any

from usg.backends.base import Backend
from usg.errors import BackendError, Overloaded, StateError, USGError
from usg.graph.model import BatchPolicy, PadPolicy
from usg.graph.state import StateSpec
from usg.records import BatchEvent, ItemTiming
from usg.runtime.controller import BatchController
from usg.runtime.cpu_gate import CpuGate
from usg.runtime.kernel import BatchKernel, Outcome
from usg.runtime.padding import group_key, item_length, item_rows, padded_elements

__all__ = ["BatchEvent", "BatchingRunner"]

log = logging.getLogger("usg.runtime.batcher")

_KEYS = 1024  # group keys a batcher remembers (shapes seen); past it, it starts over


@dataclass(eq=False, slots=True)  # identity: items hold arrays, and _take_batch looks items up with list.index
class _Pending:
    item: Mapping[str, Any]
    future: asyncio.Future[dict[str, Any]]
    enqueued: float
    key: tuple[Any, ...]
    length: int
    timing: ItemTiming | None
    rows: int = 1


def controlled(policy: BatchPolicy, backend: Backend) -> bool:
    """Whether a batching model gets the controller: ``batch.adaptive`` when written, else on when
    its calls report their CPU time (a cost other processes on the cores do not blur) or the
    graph declares ``target_p95_ms``."""
    if policy.adaptive is not None:
        return policy.adaptive
    return backend.cpu_in_caller or policy.target_p95_ms is not None


class BatchingRunner:
    def __init__(
        self,
        model: str,
        backend: Backend,
        pool: PoolExecutor,
        policy: BatchPolicy,
        *,
        concurrency: int = 1,
        listeners: Sequence[Callable[[BatchEvent], None]] | None = None,
        call_timeout_s: float | None = None,
        state: StateSpec | None = None,
        gate: CpuGate | None = None,
    ) -> None:
        self.model = model
        self.state = state
        self.backend = backend
        self.pool = pool
        self.policy = policy
        self.pad: PadPolicy | None = policy.pad
        self.listeners: list[Callable[[BatchEvent], None]] = list(listeners or ())
        self._queue: list[_Pending] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self._waiter: asyncio.Future[None] | None = None  # the scheduler's, while it waits for items
        self._keys: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # group keys seen (bounded: _KEYS)
        self._slots: asyncio.Semaphore | None = None
        self._concurrency = max(1, concurrency)
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closing = False
        self.kernel = BatchKernel(
            model,
            backend,
            policy.pad,
            pool=pool,
            call_timeout_s=call_timeout_s,
            max_parallel_retries=policy.max_size,
            state=state,
            gate=gate,
        )
        #: the dynamic batch controller (``batch.adaptive``); None: the declared values hold
        self.controller: BatchController | None = (
            BatchController(model, policy) if controlled(policy, backend) else None
        )

    batches = True  # calls are batched here (figures come from BatchEvents)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._slots = asyncio.Semaphore(self._concurrency)
            self._task = asyncio.create_task(self._schedule(), name=f"batcher:{self.model}")

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Finish every queued item (up to ``timeout_s``), then stop the scheduler."""
        self._closing = True
        self._notify()
        deadline = time.perf_counter() + timeout_s
        while (self._queue or self._running) and time.perf_counter() < deadline:
            if self._task is not None and self._task.done():
                break
            await asyncio.sleep(0.005)
        for p in self._queue:
            if not p.future.done():
                p.future.set_exception(StateError(f"model {self.model!r} stopped before this item ran"))
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.kernel.close()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def batch_cap(self) -> int:
        """The most items a batch may hold now: the controller's cap, else ``max_size``."""
        return self.controller.cap if self.controller is not None else self.policy.max_size

    @property
    def batch_wait_ms(self) -> float:
        """The longest the oldest item waits for a batch to fill (before the queue-depth scaling)."""
        return self.controller.wait_ms if self.controller is not None else self.policy.max_delay_ms

    # -- submission --------------------------------------------------------------------------
    async def submit(
        self,
        item: Mapping[str, Any],
        timing: ItemTiming | None = None,
        on_token: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Queue one item for a batch (batched local models stream no tokens: ``on_token`` is unused)."""
        self._admit()
        pending = self._enqueue(item, timing)
        return await pending.future

    async def submit_many(
        self, items: Sequence[Mapping[str, Any]], timings: Sequence[ItemTiming | None]
    ) -> list[dict[str, Any]]:
        """Submit one request's fan-out, admitted as a whole: the queue bound counts the items
        waiting before it (other requests'), never the fan-out's own items, so a fan-out that
        fits the graph's ``limits.max_fanout_items`` is not refused for its own size."""
        self._admit()
        pending = [self._enqueue(item, timing) for item, timing in zip(items, timings, strict=True)]
        return list(await asyncio.gather(*(p.future for p in pending)))

    def _admit(self) -> None:
        if self._task is None or self._task.done():
            raise StateError(f"batcher for model {self.model!r} is not started")
        if self._closing:
            raise StateError(f"model {self.model!r} is shutting down; it accepts no new items")
        if len(self._queue) >= self.policy.max_queue:
            raise Overloaded(
                f"model {self.model!r} queue is full ({len(self._queue)} items waiting, limit "
                f"{self.policy.max_queue}); retry later, or raise batch.max_queue",
                retry_after=max(0.05, self.policy.max_delay_ms / 1000 * 4),
                why=f"queue_full:{self.model}",
            )

    def _enqueue(self, item: Mapping[str, Any], timing: ItemTiming | None) -> _Pending:
        assert self._loop is not None
        key = group_key(item, self.pad)
        known = self._keys.get(key)  # one object per key: _take_batch finds a group by identity
        if known is None:
            if len(self._keys) >= _KEYS:
                self._keys.clear()
            known = self._keys[key] = key
        pending = _Pending(
            item,
            self._loop.create_future(),
            time.perf_counter(),
            known,
            item_length(item, self.pad),
            timing,
            item_rows(item, self.state),
        )
        self._queue.append(pending)
        self._notify()
        return pending

    def _notify(self) -> None:
        """Wake the scheduler if it waits (it reads the queue again before it waits again)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, timeout_s: float | None) -> None:
        """Wait until an item comes (``_notify``) or ``timeout_s`` passes: a future and a timer,
        not ``asyncio.wait_for`` (a task and its callbacks each time an item shortens the wait)."""
        assert self._loop is not None
        waiter = self._waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout_s, _resolve, waiter) if timeout_s is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    # -- scheduling --------------------------------------------------------------------------
    def _delay_s(self) -> float:
        """Adaptive wait: the full max_delay when traffic is light, shorter as the queue deepens."""
        depth = len(self._queue)
        fill = min(1.0, depth / max(1, self.batch_cap))
        return self.batch_wait_ms / 1000.0 * (1.0 - fill)

    async def _schedule(self) -> None:
        assert self._slots is not None
        while True:
            try:
                await self._schedule_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the scheduler die with items queued
                log.exception("batcher %s: scheduler error", self.model)
                for p in self._queue:
                    if not p.future.done():
                        p.future.set_exception(BackendError(f"model {self.model!r}: batcher failed: {exc}"))
                self._queue.clear()

    async def _schedule_once(self) -> None:
        assert self._slots is not None
        if not self._queue:
            await self._sleep(None)
            return
        oldest = self._queue[0].enqueued  # the queue keeps the order items came in
        wait = oldest + self._delay_s() - time.perf_counter()
        if wait > 0 and not self._closing and len(self._queue) < self.batch_cap:
            await self._sleep(wait)
            return
        await self._slots.acquire()
        try:
            batch = self._take_batch()
        except BaseException:
            self._slots.release()
            raise
        if not batch:
            self._slots.release()
            return
        task = asyncio.create_task(self._run_batch(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _take_batch(self) -> list[_Pending]:
        """Pick the group of the oldest item, ordered by length, within size and budget limits."""
        self._queue = [p for p in self._queue if not p.future.cancelled()]
        if not self._queue:
            return []
        cap = self.batch_cap
        if self.controller is not None:
            self.controller.formed(len(self._queue))
        head = self._queue[0]  # the oldest: the queue keeps the order items came in
        key = head.key
        if self.pad is None and all(p.key is key and p.length == head.length for p in self._queue):
            # one group of one length (a stateful model's windows): the steps below pick the oldest
            return self._take_oldest(cap)
        group = sorted((p for p in self._queue if p.key is key or p.key == key), key=lambda p: (p.length, p.enqueued))
        # start the batch around the oldest item's length so it is never starved
        start = group.index(head)
        chosen: list[_Pending] = [head]
        lo, hi = start - 1, start + 1
        while len(chosen) < cap and (lo >= 0 or hi < len(group)):
            # grow toward the neighbour closest in length: least padding waste
            cand_lo = group[lo] if lo >= 0 else None
            cand_hi = group[hi] if hi < len(group) else None
            if cand_hi is None or (
                cand_lo is not None and head.length - cand_lo.length <= cand_hi.length - head.length
            ):
                cand, lo = cand_lo, lo - 1
            else:
                cand, hi = cand_hi, hi + 1
            assert cand is not None
            if self.pad is not None and not self._within_budget([*chosen, cand]):
                break
            chosen.append(cand)
        if self.policy.preferred_sizes and len(chosen) not in self.policy.preferred_sizes:
            fits = [s for s in self.policy.preferred_sizes if s <= len(chosen)]
            if fits:
                chosen = sorted(chosen, key=lambda p: p.enqueued)[: max(fits)]
        taken = {id(p) for p in chosen}
        self._queue = [p for p in self._queue if id(p) not in taken]
        return chosen

    def _take_oldest(self, cap: int) -> list[_Pending]:
        """The ``cap`` oldest items (fewer for ``preferred_sizes``), in the order they came in."""
        chosen = self._queue[:cap]
        if self.policy.preferred_sizes and len(chosen) not in self.policy.preferred_sizes:
            fits = [s for s in self.policy.preferred_sizes if s <= len(chosen)]
            if fits:
                chosen = chosen[: max(fits)]
        self._queue = self._queue[len(chosen) :]
        return chosen

    def _within_budget(self, items: list[_Pending]) -> bool:
        """Padded elements within max_tokens/max_pixels, and padding waste within max_pad_waste."""
        if self.pad is None:
            return True
        padded = padded_elements([p.item for p in items], self.pad)
        budget = self.policy.max_tokens or self.policy.max_pixels
        if budget is not None and padded > budget:
            return False
        # waste from unequal lengths only (rounding up to a multiple or bucket is paid anyway)
        rows = sum(p.rows for p in items)
        longest = max(p.length for p in items)
        real = sum(p.length * p.rows for p in items)
        return longest == 0 or (rows * longest - real) / (rows * longest) <= self.policy.max_pad_waste

    # -- running -----------------------------------------------------------------------------
    async def _run_batch(self, batch: list[_Pending]) -> None:
        assert self._slots is not None
        slots = self._slots
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                slots.release()

        started = time.perf_counter()
        waits = [(started - p.enqueued) * 1e3 for p in batch]

        def deliver(i: int, outcome: Outcome, timing: ItemTiming) -> None:
            p = batch[i]
            if isinstance(outcome, USGError):
                if not p.future.done():
                    p.future.set_exception(outcome)
                return
            if p.timing is not None:
                p.timing.queue_ms, p.timing.compute_ms = timing.queue_ms, timing.compute_ms
                p.timing.batch_size = timing.batch_size
            if not p.future.done():
                p.future.set_result(outcome)

        try:
            await self.kernel.run([p.item for p in batch], waits, deliver, self._emit, release, [p.rows for p in batch])
        except Exception as exc:  # a bug in assembling/splitting: fail these items, keep serving
            log.exception("batcher %s: batch failed outside the backend", self.model)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(BackendError(f"model {self.model!r}: batching failed: {exc}"))
        finally:
            release()

    def _emit(self, event: BatchEvent, indices: tuple[int, ...]) -> None:
        if self.controller is not None:
            self.controller.observe(event)
        for listener in self.listeners:
            listener(event)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
