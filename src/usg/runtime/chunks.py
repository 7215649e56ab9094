"""One chunk of a sequential stream, run lean: what a session's run needs and nothing more.

A streaming session (:mod:`usg.stream`) makes one executor run per chunk — ~31 a second for each
16 kHz stream sent in 32 ms chunks — and the event loop is one thread: what a run costs it bounds
the streams one process carries while the models' calls, batched across streams, run on worker
threads. :meth:`usg.runtime.Executor.run_chunk` runs a chunk whose values the session already
checked when it was sent (:func:`usg.stream.session.check_audio_chunk`) through a
:class:`ChunkPlan` worked out once per set of present inputs. Compared with
:meth:`~usg.runtime.Executor.infer` it skips what a chunk does not need: decoding and re-checking
the inputs, their digests (a session runs without a node cache, and no response carries them), the
plan lookup by set, a task per node, and the per-node timing records when no observer reads them;
Python nodes declared ``inline`` are called directly. It keeps the rest: the executor's state and
deadline, every observer hook in the same order, errors naming the node that failed, pruning and
branch skipping, ``session_state`` / ``ts_ms`` / ``flush``, and stateful models' state per stream.
So a chunk gives the events and errors it gives through :meth:`~usg.runtime.Executor.infer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from usg.errors import RequestTimeout, USGError
from usg.graph.model import Graph, NodeDef
from usg.records import ItemTiming
from usg.runtime.observer import Observer
from usg.runtime.request import call_fn, missing_graph_output, missing_output
from usg.runtime.result import InferResult
from usg.runtime.streams import STREAM_PARAMS, StreamState

__all__ = ["ChunkHost", "ChunkPlan", "Deadlines", "InlineFn", "plan_chunk", "run_chunk"]


class InlineFn(NamedTuple):
    """A Python node that may run on the event loop (an op declared ``inline``, not a ``map``
    node): its function, the options it accepts, the parameters it takes and its inline decider
    (None: always inline)."""

    call: Callable[..., Any]
    opts: Mapping[str, Any]
    params: set[str]
    decide: Callable[[Mapping[str, Any]], bool] | None


class ChunkHost(Protocol):
    """What a chunk run needs of the executor running it (:class:`usg.runtime.Executor`)."""

    graph: Graph
    observers: list[Observer]
    timeout_s: float
    _inflight: int
    _deadlines: Deadlines

    async def _run_model_node(
        self, node: NodeDef, args: dict[str, Any], timing: ItemTiming | None, stream: StreamState
    ) -> tuple[dict[str, Any], int]: ...

    async def _run_fn_node(
        self, node: NodeDef, args: dict[str, Any], stream: StreamState
    ) -> tuple[dict[str, Any], int]: ...

    def _node_finished(
        self, rid: str, node: NodeDef, start: float, end: float, timing: ItemTiming | None, items: int, ok: bool
    ) -> None: ...


#: a node input's wire: port, from a graph input?, source (the input or node), its port, optional?
_Wire = tuple[str, bool, str, str, bool]


@dataclass(frozen=True, slots=True)
class _Step:
    """A node of the plan: its wires; for a Python node that may run on the loop (an op declared
    ``inline``, not a ``map`` node) its function, options, the stream parameters it takes and its
    inline decider (None: always inline)."""

    name: str
    node: NodeDef
    wires: tuple[_Wire, ...]
    call: Callable[..., Any] | None = None
    opts: Mapping[str, Any] = field(default_factory=dict)
    params: tuple[str, ...] = ()  # of session_state, ts_ms, flush
    decide: Callable[[Mapping[str, Any]], bool] | None = None


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """The run of a chunk with a given set of inputs: its nodes in graph order, the nodes pruned,
    the inputs' modalities (for the observers) and the graph outputs' wires."""

    steps: tuple[_Step, ...]
    pruned: tuple[str, ...]
    modalities: tuple[str, ...]
    outputs: tuple[tuple[str, bool, str, str], ...]  # output, from a graph input?, source, port


def plan_chunk(
    graph: Graph,
    present: frozenset[str],
    plan: Callable[[set[str]], tuple[list[str], list[str]]],
    inline: Mapping[str, InlineFn],
) -> ChunkPlan | None:
    """The plan for chunks carrying ``present`` (``plan``: the executor's nodes that run and
    pruned for a set of inputs); None when :meth:`Executor.infer` must run them (an unknown
    input, a required input missing: it raises the error with its fix)."""
    if not present or not present <= graph.inputs.keys():
        return None
    if any(not d.optional and n not in present for n, d in graph.inputs.items()):
        return None
    active, pruned = plan(set(present))
    steps = []
    for name in active:
        node = graph.nodes[name]
        wires = tuple(
            (port, ref.is_graph_input, ref.port if ref.is_graph_input else ref.source, ref.port, port in node.optional)
            for port, ref in node.inputs.items()
        )
        fn = inline.get(name)
        if fn is None:
            steps.append(_Step(name, node, wires))
            continue
        params = tuple(p for p in STREAM_PARAMS if p in fn.params)
        steps.append(_Step(name, node, wires, fn.call, fn.opts, params, fn.decide))
    modalities = tuple(sorted(graph.inputs[n].modality.value for n in present))
    outputs = tuple(
        (out, ref.is_graph_input, ref.port if ref.is_graph_input else ref.source, ref.port)
        for out, ref in graph.outputs.items()
    )
    return ChunkPlan(tuple(steps), tuple(pruned), modalities, outputs)


def _args(step: _Step, values: dict[str, Any], outputs: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    """The node's inputs by port, or None when one is absent (its branch is skipped): what
    :meth:`usg.runtime.request.Request.node_args` gives, from the wires worked out once."""
    args: dict[str, Any] = {}
    absent = False
    for port, from_input, source, out, optional in step.wires:
        if from_input:
            value = values.get(source)
            if value is None and optional:
                continue  # the node runs without it
            args[port] = values[source]
        else:
            up = outputs.get(source)
            if optional and (up is None or up.get(out) is None):
                continue
            if up is None:  # upstream skipped at run time
                return None
            if out not in up:
                raise missing_output(source, out, up, step.name)
            value = args[port] = up[out]
        absent = absent or value is None
    return None if absent else args


async def run_chunk(
    ex: ChunkHost, plan: ChunkPlan, values: dict[str, Any], stream: StreamState, rid: str
) -> InferResult:
    """Run one chunk (``values``: checked by the session); see the module docstring."""
    observers = ex.observers
    pruned: list[str] = []
    if observers:
        for obs in observers:
            obs.request_started(rid, plan.modalities)
            obs.request_integrity(rid, {})
    t0 = time.perf_counter()
    ex._inflight += 1
    status = "error"
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    deadline = ex.timeout_s
    deadlines = ex._deadlines
    deadlines.enter(task, deadline)
    try:
        outputs: dict[str, dict[str, Any] | None] = {}
        node_ms: dict[str, float] = {}
        skipped = False
        for step in plan.steps:
            name, node = step.name, step.node
            args = _args(step, values, outputs)
            if args is None:  # an upstream was skipped, or said "nothing here": skip this branch
                outputs[name] = None
                skipped = True
                continue
            start = time.perf_counter()
            timing = ItemTiming() if observers else None
            items = 1
            ok = False
            try:
                call = step.call
                if call is not None and (step.decide is None or step.decide(args)):
                    outputs[name] = call_fn(node, call, args, _opts(step, stream) if step.params else step.opts)
                elif node.model is not None:
                    outputs[name], items = await ex._run_model_node(node, args, timing, stream)
                else:
                    outputs[name], items = await ex._run_fn_node(node, args, stream)
                ok = True
            except USGError as exc:
                if exc.node is None:  # the first node that failed names itself
                    exc.node = name
                raise
            finally:
                end = time.perf_counter()
                node_ms[name] = (end - start) * 1e3
                if observers:
                    ex._node_finished(rid, node, start, end, timing, items, ok)
        if observers:
            for obs in observers:
                obs.request_values(rid, values, outputs)
        if skipped:
            gone = {*plan.pruned, *(s.name for s in plan.steps if outputs.get(s.name) is None)}
            pruned = sorted(gone, key=ex.graph.order.index)
        else:
            pruned = list(plan.pruned)
        result: dict[str, Any] = {}
        for out, from_input, source, port in plan.outputs:
            if from_input:
                if source in values:
                    result[out] = values[source]
                continue
            up = outputs.get(source)
            if up is None:
                continue
            if port not in up:  # (a map node's empty fan-out has every port: [])
                raise missing_graph_output(source, port, up, out)
            if up[port] is not None:
                result[out] = up[port]
        status = "ok"
        return InferResult(result, pruned, node_ms, rid, {})
    except asyncio.CancelledError:
        if deadlines.expired(task) and task.uncancel() <= cancelling:
            status = "timeout"
            raise RequestTimeout(
                f"request {rid} did not finish within {deadline:g} s; fix: raise the timeout, "
                "or check `usg doctor` / the metrics for a slow model"
            ) from None
        raise
    finally:
        deadlines.leave(task)
        ex._inflight -= 1
        if observers:
            if status != "ok":
                pruned = []
            for obs in observers:
                obs.request_finished(rid, plan.modalities, time.perf_counter() - t0, status, pruned)


def _opts(step: _Step, stream: StreamState) -> dict[str, Any]:
    """A Python node's options and the stream parameters it takes (as StreamState.node_params)."""
    opts = dict(step.opts)
    for p in step.params:
        if p == "session_state":
            state = stream.nodes.get(step.name)
            if state is None:
                state = stream.nodes[step.name] = {}
            opts[p] = state
        else:
            opts[p] = stream.ts_ms if p == "ts_ms" else stream.flush
    return opts


class Deadlines:
    """The deadline of every chunk run in flight on one event loop, kept by one timer.

    What ``asyncio.timeout`` does for a run — a timer that cancels it, turned into
    :class:`~usg.errors.RequestTimeout` — without a timer of its own: at 256 streams ~8,000 runs
    a second would each push a timer onto the loop's heap and cancel it, and every timer the loop
    keeps (the cancelled ones stay in the heap until it cleans up) makes each push and pop dearer.
    The one timer is armed at the earliest deadline in flight; when it fires it cancels the runs
    past theirs and re-arms at the next one."""

    __slots__ = ("_expired", "_runs", "_timer")

    def __init__(self) -> None:
        self._runs: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def enter(self, task: asyncio.Task[Any], timeout_s: float) -> None:
        """``task`` starts a run that must end within ``timeout_s``."""
        loop = task.get_loop()
        at = loop.time() + timeout_s
        self._runs[task] = at
        if self._timer is None:
            self._timer = loop.call_at(at, self._check, loop)
        elif at < self._timer.when():  # a shorter timeout than the runs in flight
            self._timer.cancel()
            self._timer = loop.call_at(at, self._check, loop)

    def leave(self, task: asyncio.Task[Any]) -> None:
        self._runs.pop(task, None)
        self._expired.discard(task)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task``'s run was cancelled for passing its deadline."""
        return task in self._expired

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time() + 1e-3  # the loop runs a timer up to its clock resolution early
        for task, at in list(self._runs.items()):
            if at <= now:
                del self._runs[task]
                self._expired.add(task)
                task.cancel()
        if self._runs:
            self._timer = loop.call_at(min(self._runs.values()), self._check, loop)
