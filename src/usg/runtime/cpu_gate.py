"""A cap on CPU-bound model calls in flight across an executor's models: one per usable core.

A single-threaded CPU session (ONNX Runtime with ``intra_op_threads: 1``, which reports its
cost as the calling thread's CPU time: :attr:`usg.backends.base.Backend.cpu_in_caller`)
occupies one core for its whole call. Each model's ``concurrency`` is set for that model
alone; together they may put more such calls in flight than there are cores (the document
graph: det 2 + rec 2 + cls 1 on 2 cores), and the extra ones finish no earlier — they only
add context switches and cache misses to every call. The gate lets at most ``slots`` of them
run at once, first come first served across models; a call waiting for a slot counts as
queueing, not compute (so the batch controller's per-item costs and the bench breakdown stay
honest). Sessions that run several threads per call, GPUs and remote backends are not gated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from usg.backends.base import Backend

__all__ = ["CpuGate", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


class CpuGate:
    """At most ``slots`` gated calls at a time (``slots=0``: no cap); see the module docstring."""

    def __init__(self, slots: int | None = None) -> None:
        self.slots = usable_cores() if slots is None else max(0, slots)
        self._sem: asyncio.Semaphore | None = None  # made on first use, on the executor's loop
        self.running = 0
        self.peak = 0  # most gated calls ever in flight at once

    def applies(self, backend: Backend) -> bool:
        """Whether ``backend``'s calls are gated: a local single-threaded CPU session."""
        return self.slots > 0 and backend.cpu_in_caller and not backend.remote

    @contextlib.asynccontextmanager
    async def hold(self, backend: Backend) -> AsyncIterator[None]:
        """A slot for one call of ``backend`` (none needed when the gate does not apply to it)."""
        if not self.applies(backend):
            yield
            return
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        async with self._sem:
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                yield
            finally:
                self.running -= 1
