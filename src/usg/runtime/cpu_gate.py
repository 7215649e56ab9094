"""A cap on CPU-bound model calls in flight across an executor's models: one per usable core,
handed out nearest-the-output first.

A single-threaded CPU session (ONNX Runtime with ``intra_op_threads: 1``, which reports its
cost as the calling thread's CPU time: :attr:`usg.backends.base.Backend.cpu_in_caller`)
occupies one core for its whole call. Each model's ``concurrency`` is set for that model
alone; together they may put more such calls in flight than there are cores (the document
graph: det 2 + rec 2 + cls 1 on 2 cores), and the extra ones finish no earlier — they only
add context switches and cache misses to every call. The gate lets at most ``slots`` of them
run at once; a call waiting for a slot counts as queueing, not compute (so the batch
controller's per-item costs and the bench breakdown stay honest). Sessions that run several
threads per call, GPUs and remote backends are not gated.

Order by the graph: each model has a rank, its distance to the graph's outputs
(:func:`output_ranks`: the longest path of nodes from its nearest-the-output node to a sink). A
call may start while fewer than ``slots`` calls **of its rank or nearer the output** run — calls
further up do not count against it, so they never hold a later step back — and a freed slot goes
to the waiting call nearest the output, first come first served among equals. On the document
graph: rec and cls start whenever fewer than two of them run, and det takes the cores they leave.
Without it (the operating system sharing the cores among det's two single-threaded calls and
rec's two), det took about half of the cores while requests waited at det, and the requests det
had passed piled up at rec (3.3 s queue wait per rec item; benchmarks/README.md,
issue #21, session 10). Each call that waited, and each grant that went past an earlier waiter of
another model, is counted (:attr:`CpuGate.waited`, :attr:`CpuGate.overtook`; ``usg_cpu_gate_*`` on
``/metrics``). With one rank for every model (``ranks={}``) it is a plain cap, first come first
served.

A graph whose gated calls can never outnumber the slots (speech-stream: silero's two calls on two
cores) skips the gate: :meth:`CpuGate.fit` is told each gated model's calls in flight at start, and
when they sum to ``slots`` or fewer no call could ever wait, so none pays for the bookkeeping (3.5 µs
of event-loop time a call) and none is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping

from usg.backends.base import Backend
from usg.graph.model import Graph

__all__ = ["CpuGate", "output_ranks", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def output_ranks(graph: Graph) -> dict[str, int]:
    """Per model, the longest path (in nodes) from its nearest-the-output node to a sink of the
    graph: 0 for a model whose node nothing reads, larger further up. A node upstream of another
    always ranks higher, so a free core goes to the later step first (the document graph: rec 5,
    cls 7, det 11)."""
    height: dict[str, int] = {}
    readers: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for name, node in graph.nodes.items():
        for ref in node.inputs.values():
            if not ref.is_graph_input and ref.source in readers:
                readers[ref.source].append(name)
    order = list(graph.order) if graph.order else list(graph.nodes)
    for name in reversed(order):
        height[name] = 1 + max((height[r] for r in readers[name]), default=-1)
    ranks: dict[str, int] = {}
    for name, node in graph.nodes.items():
        if node.model is not None:
            ranks[node.model] = min(ranks.get(node.model, height[name]), height[name])
    return ranks


class CpuGate:
    """At most ``slots`` gated calls at a time (``slots=0``: no cap), a freed slot going to the
    waiting call of the lowest ``ranks[model]`` (unranked: last); see the module docstring."""

    def __init__(self, slots: int | None = None, ranks: Mapping[str, int] | None = None) -> None:
        self.slots = usable_cores() if slots is None else max(0, slots)
        self.ranks: dict[str, int] = dict(ranks or {})
        self._waiting: list[tuple[int, int, str, asyncio.Future[None]]] = []  # heap: rank, arrival, model
        self._arrivals = itertools.count()
        self._by_rank: Counter[int] = Counter()  # calls running, by rank
        self.running = 0
        self.peak = 0  # most gated calls ever in flight at once
        self.calls: Counter[str] = Counter()  # gated calls by model
        self.waited: Counter[str] = Counter()  # of them, those that waited for a slot
        self.wait_s: defaultdict[str, float] = defaultdict(float)  # their waits, summed (seconds)
        self.overtook: Counter[str] = Counter()  # grants that went past an earlier waiter of another model
        #: set by fit(): the gated models' calls in flight can never outnumber the slots (nothing gated)
        self.idle = False

    def covers(self, backend: Backend) -> bool:
        """Whether ``backend`` is a local single-threaded CPU session (what the gate counts)."""
        return backend.cpu_in_caller and not backend.remote

    def fit(self, calls: Mapping[str, int]) -> None:
        """Tell the gate each covered model's most calls in flight (``options.concurrency``); when
        they sum to ``slots`` or fewer, no call could ever wait: the gate stands aside (:attr:`idle`)."""
        self.idle = sum(calls.values()) <= self.slots

    def applies(self, backend: Backend) -> bool:
        """Whether ``backend``'s calls are gated: a local single-threaded CPU session, while the gate
        has slots and the covered models could outnumber them."""
        return self.slots > 0 and not self.idle and backend.cpu_in_caller and not backend.remote

    def rank(self, model: str) -> int:
        return self.ranks.get(model, max(self.ranks.values(), default=0) + 1)

    @contextlib.asynccontextmanager
    async def hold(self, backend: Backend, model: str = "") -> AsyncIterator[None]:
        """A slot for one call of ``model`` (none needed when the gate does not apply to it)."""
        if not self.applies(backend):
            yield
            return
        rank = self.rank(model)
        self.calls[model] += 1
        if self._free(rank) and not (self._waiting and self._waiting[0][0] <= rank):
            self._take(rank)
        else:
            await self._wait(rank, model)
        try:
            yield
        finally:
            self._release(rank)

    def _free(self, rank: int) -> bool:
        """Whether a call of ``rank`` may start: fewer than ``slots`` calls of that rank or nearer
        the output run (calls further up do not count: they never hold a later step back)."""
        return sum(n for r, n in self._by_rank.items() if r <= rank) < self.slots

    def _take(self, rank: int) -> None:
        self._by_rank[rank] += 1
        self.running += 1
        self.peak = max(self.peak, self.running)

    async def _wait(self, rank: int, model: str) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (rank, next(self._arrivals), model, granted)
        heapq.heappush(self._waiting, entry)
        t0 = time.perf_counter()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(rank)  # the slot came with the cancellation: pass it on
            else:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            raise
        self.waited[model] += 1
        self.wait_s[model] += time.perf_counter() - t0

    def _release(self, rank: int) -> None:
        self._by_rank[rank] -= 1
        self.running -= 1
        # the waiter nearest the output first; when it may not start, no one further up may
        while self._waiting and (self._waiting[0][3].done() or self._free(self._waiting[0][0])):
            r, arrival, model, granted = heapq.heappop(self._waiting)
            if granted.done():  # cancelled while waiting
                continue
            if any(a < arrival and m != model for _, a, m, f in self._waiting if not f.done()):
                self.overtook[model] += 1
            self._take(r)
            granted.set_result(None)
