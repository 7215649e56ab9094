"""The in-process executor: one asyncio task per active node, backends in worker threads.

Per request it decides which nodes run (nodes whose inputs are absent are
pruned, transitively), runs each node as soon as its inputs are ready (so
independent branches overlap), checks every model input against its
contract, and hands items to a per-model runner — direct, or a batcher that
groups items across nodes and requests.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from usg.backends import Backend
from usg.cache import NodeCache, check_expected, digest_inputs
from usg.callables import accepted_params, import_callable
from usg.errors import GraphError, RequestTimeout, StateError, UsageError, USGError
from usg.graph.model import Graph, NodeDef
from usg.graph.state import state_problems
from usg.ops.signature import signature_of
from usg.records import CacheEvent, ItemTiming, NodeEvent
from usg.runtime.chunks import ChunkPlan, Deadlines, InlineFn, plan_chunk, run_chunk
from usg.runtime.cpu_gate import CpuGate, output_ranks
from usg.runtime.deferral import call_deferring, deferred_ports
from usg.runtime.events import (
    EventSink,
    ExecutionEvent,
    Finished,
    NodeFinished,
    TokenCallback,
    stream_events,
)
from usg.runtime.inputs import Undecoded, decode_pending, normalize_inputs
from usg.runtime.loop_thread import LoopThread
from usg.runtime.model_nodes import ModelNodes, split_map
from usg.runtime.observer import Observer
from usg.runtime.request import EmptyFanOut, Request, call_fn, plan_request
from usg.runtime.result import InferResult
from usg.runtime.runner import DirectRunner, ModelRunner, backend_for, concurrency_for
from usg.runtime.streams import StreamState
from usg.specs import Modality

__all__ = ["Executor", "ExecutorState"]

_ids = itertools.count(1)


class ExecutorState(enum.StrEnum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class Executor:
    """Runs a :class:`~usg.graph.Graph`.

    ``backends`` overrides the backend of named models (tests pass ``FakeBackend``s; the
    Ray engine passes remote backends, which are never batched here — their deployment
    batches). ``fns`` overrides the callable of named Python nodes (called with the same
    keyword arguments as the node's function; the Ray engine passes callables that run the
    node in its own deployment). ``batching=False`` forces one backend call per item even
    where the graph declares a batch policy. ``timeout_s`` is the default per-request deadline.
    ``cache=False`` ignores the graph's ``cache:`` settings (no node is cached).
    ``cpu_slots`` caps single-threaded CPU model calls in flight across all models, a free core
    going to the step nearest the graph's outputs first (default ``None``: the usable cores; 0: no
    cap, the operating system shares the cores; :mod:`usg.runtime.cpu_gate`, benchmarks/README.md
    issue #21 session 10).
    """

    def __init__(
        self,
        graph: Graph,
        *,
        backends: Mapping[str, Backend] | None = None,
        fns: Mapping[str, Callable[..., dict[str, Any]]] | None = None,
        timeout_s: float = 60.0,
        batching: bool = True,
        workers: int | None = None,
        observers: Sequence[Observer] = (),
        cache: bool = True,
        cpu_slots: int | None = None,
    ) -> None:
        self.graph = graph
        #: CPU-bound (single-threaded CPU) model calls in flight across models: at most one per
        #: usable core (cpu_slots=None, the default), nearest the output first; see usg.runtime.cpu_gate
        self.cpu_gate = CpuGate(cpu_slots, output_ranks(graph))
        self.timeout_s = timeout_s
        self.batching = batching
        self.observers = list(observers)
        self.state = ExecutorState.NEW
        self._backends: dict[str, Backend] = dict(backends or {})
        self._runners: dict[str, ModelRunner] = {}
        n_workers = workers or max(4, 2 * len(graph.models) + 2)
        self._pool = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="usg-worker")
        self._fns: dict[str, Any] = {}
        self._fn_overrides = dict(fns or {})
        unknown = sorted(n for n in self._fn_overrides if n not in graph.nodes or graph.nodes[n].fn is None)
        if unknown:
            fn_nodes = sorted(n for n, d in graph.nodes.items() if d.fn is not None)
            raise UsageError(
                f"fns= names {unknown}, which are not Python nodes of graph {graph.name!r}; fix: use {fn_nodes}"
            )
        self._fn_params: dict[str, tuple[set[str], bool]] = {}
        self._fn_opts: dict[str, dict[str, Any]] = {}  # the options each function accepts
        self._fn_inline: dict[str, Callable[[Mapping[str, Any]], bool]] = {}
        self._inline_fns: dict[str, InlineFn] = {}  # the same nodes, for chunk plans (usg.runtime.chunks)
        self._model_nodes = ModelNodes(graph, self._backends, self._runners)
        self._sync = LoopThread()
        self._inflight = 0
        self._plans: dict[frozenset[str], tuple[list[str], list[str]]] = {}
        self._chunk_plans: dict[frozenset[str], ChunkPlan | None] = {}
        self._deadlines = Deadlines()  # of the chunk runs in flight (run_chunk)
        self._chains: dict[tuple[str, ...], bool] = {}
        self._deferred: dict[str, frozenset[str]] = {}  # fn node -> ports only remote models read
        node_cache = NodeCache(graph, self._cache_event, EmptyFanOut) if cache else None
        self.cache = node_cache if node_cache is not None and node_cache.enabled else None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Create and load backends (in worker threads) and start the runners. Idempotent."""
        if self.state is ExecutorState.RUNNING:
            return
        if self.state is not ExecutorState.NEW:
            raise StateError(f"executor is {self.state.value}; create a new Executor to run again")
        loop = asyncio.get_running_loop()
        for name, model in self.graph.models.items():
            if name not in self._backends:
                try:
                    self._backends[name] = backend_for(model)
                except GraphError as exc:  # a backend's own option check (openai: url, ${VAR}): name the file
                    if exc.source is not None or self.graph.source is None:
                        raise
                    raise GraphError(exc.problems, source=str(self.graph.source)) from None
        await asyncio.gather(*(loop.run_in_executor(self._pool, b.load) for b in self._backends.values()))
        if self.cache is not None:  # hashes model files once
            await loop.run_in_executor(self._pool, self.cache.prepare)
        self._check_states()
        # the CPU gate stands aside when the covered models' calls can never outnumber its slots
        gate = self.cpu_gate
        gate.fit(
            {
                n: concurrency_for(m, self._backends[n])
                for n, m in self.graph.models.items()
                if gate.covers(self._backends[n])
            }
        )
        for name in self.graph.models:
            backend = self._backends[name]
            self._model_nodes.add(name, backend)
            self._runners[name] = self._make_runner(name, backend)
        for runner in self._runners.values():
            await runner.start()
        # usg.runtime.deferral: arrays this process only sends (not while an observer reads node values)
        self._deferred = deferred_ports(self.graph, self._backends, cached=self.cache is not None)
        self._model_nodes.deferring = bool(self._deferred)
        for node in self.graph.nodes.values():
            if node.fn is not None:
                # an override (a node run elsewhere) is called instead and never imports the
                # node's module here; it gets every option and filters them itself
                func = self._fn_overrides.get(node.name) or import_callable(node.fn)
                self._fns[node.name] = func
                self._fn_params[node.name] = names, var_kw = accepted_params(func)
                self._fn_opts[node.name] = {k: v for k, v in node.options.items() if var_kw or k in names}
                sig = signature_of(func)
                if sig is not None and sig.inline and not node.map:
                    decide = sig.inline
                    self._fn_inline[node.name] = decide if callable(decide) else (lambda _args: True)
                    per_call = decide if callable(decide) else None  # None: always inline
                    self._inline_fns[node.name] = InlineFn(func, self._fn_opts[node.name], names, per_call)
        self.state = ExecutorState.RUNNING

    def _check_states(self) -> None:
        """Stateful models' ``state:`` against the loaded backends' inputs and outputs."""
        problems = []
        for name, model in self.graph.models.items():
            if model.state is not None:
                backend = self._backends[name]
                where = f"models.{name}.state"
                problems += state_problems(where, model.state, backend.input_specs, backend.output_specs)
        if problems:
            raise GraphError(problems, source=str(self.graph.source) if self.graph.source else None)

    def _make_runner(self, name: str, backend: Backend) -> ModelRunner:
        model = self.graph.models[name]
        concurrency = concurrency_for(model, backend)
        listeners = [obs.batch_finished for obs in self.observers]
        if backend.remote_batching:
            backend.batch_listeners[:] = listeners
        if self.batching and model.batch.enabled and not backend.remote:
            from usg.runtime.batcher import BatchingRunner

            return BatchingRunner(
                name,
                backend,
                self._pool,
                model.batch,
                concurrency=concurrency,
                listeners=listeners,
                call_timeout_s=model.call_timeout_s,
                state=model.state,
                gate=self.cpu_gate,
            )
        return DirectRunner(
            name, backend, self._pool, concurrency=concurrency, call_timeout_s=model.call_timeout_s, gate=self.cpu_gate
        )

    async def aclose(self) -> None:
        """Stop runners (finishing queued items) and close backends."""
        if self.state in (ExecutorState.CLOSED, ExecutorState.CLOSING):
            return
        self.state = ExecutorState.CLOSING
        for runner in self._runners.values():
            await runner.stop()
        for backend in self._backends.values():
            await backend.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.state = ExecutorState.CLOSED

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def runners(self) -> Mapping[str, ModelRunner]:
        return self._runners

    # -- requests ----------------------------------------------------------------------------
    def _chain(self, ran: list[str]) -> bool:
        """Whether each node of ``ran`` (in graph order) takes an input from the node before it:
        nothing could run in parallel, so the request runs them in its own task, one after the
        other (no task, no wake-up per node; e.g. a prompt node then its LLM node)."""
        key = tuple(ran)
        chain = self._chains.get(key)
        if chain is None:
            nodes = self.graph.nodes
            chain = self._chains[key] = all(
                any(not r.is_graph_input and r.source == before for r in nodes[name].inputs.values())
                for before, name in itertools.pairwise(ran)
            )
        return chain

    def plan(self, present: set[str]) -> tuple[list[str], list[str]]:
        key = frozenset(present)
        cached = self._plans.get(key)
        if cached is None:
            cached = self._plans[key] = plan_request(self.graph, present)
        return cached

    def _cache_event(self, event: CacheEvent) -> None:
        for obs in self.observers:
            obs.cache_event(event)

    def _is_flush(self, inputs: Mapping[str, Any]) -> bool:
        """Inputs of a stream's flush run: only audio inputs, each an empty float32 array."""
        return bool(inputs) and all(
            isinstance(v, np.ndarray)
            and v.size == 0
            and v.dtype == np.float32
            and self.graph.inputs.get(k) is not None
            and self.graph.inputs[k].modality is Modality.AUDIO
            for k, v in inputs.items()
        )

    def _prepare_inputs(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        # with a node cache, images are checked from their header and decoded only if a node that
        # runs needs them (a hit is answered from the bytes' digest); observers that read the
        # decoded inputs (the monitor) get every image decoded
        defer = self.cache is not None and not self._observers_read_values
        return normalize_inputs(self.graph, inputs, defer_images=defer), digest_inputs(self.graph, inputs)

    @property
    def _observers_read_values(self) -> bool:
        return any(type(obs).request_values is not Observer.request_values for obs in self.observers)

    def _inputs_to_decode(self, state: Request, active: list[str], skip: set[str]) -> list[str]:
        pending = {n for n, v in state.values.items() if isinstance(v, Undecoded)}
        if not pending:
            return []
        needed = {r.port for r in self.graph.outputs.values() if r.is_graph_input}
        for name in active:
            if name not in skip:
                needed.update(r.port for r in self.graph.nodes[name].inputs.values() if r.is_graph_input)
        return sorted(pending & needed)

    async def infer(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        request_id: str | None = None,
        expect_sha256: Mapping[str, str] | None = None,
        events: EventSink | None = None,
        stream: StreamState | None = None,
    ) -> InferResult:
        """Run one request. Absent optional inputs prune the nodes that need them.

        ``expect_sha256`` maps input names to the SHA-256 the client computed; a mismatch with
        the input as received is an :class:`~usg.errors.InputError` naming both digests.
        ``events`` gets a :class:`~usg.runtime.events.NodeFinished` per node that ran and the
        :class:`~usg.runtime.events.TokenDelta` s of LLM nodes as they arrive (:meth:`stream`).
        ``stream``: the state of the stream this request is a chunk of (a session's; see
        :mod:`usg.runtime.streams`); None: the request is a whole stream of its own."""
        if self.state is ExecutorState.NEW:
            await self.start()
        if self.state is not ExecutorState.RUNNING:
            raise StateError(f"executor is {self.state.value}; it accepts no new requests")
        rid = request_id or f"r{next(_ids)}"
        digests: dict[str, str]
        if stream is not None and stream.flush and self._is_flush(inputs):
            values, digests = dict(inputs), {}  # a session's flush run: audio inputs with no samples
        elif (
            stream is not None
            and stream.sequential
            and self.cache is None
            and expect_sha256 is None
            and all(isinstance(v, np.ndarray) for v in inputs.values())
        ):
            values, digests = normalize_inputs(self.graph, inputs), {}  # a session's decoded chunk
        elif any(
            isinstance(v, (bytes, bytearray, str, Path, list))
            and self.graph.inputs.get(k) is not None
            and self.graph.inputs[k].modality in (Modality.IMAGE, Modality.AUDIO)
            for k, v in inputs.items()
        ):
            # decoding an image or audio file takes milliseconds: keep it off the event loop
            loop = asyncio.get_running_loop()
            values, digests = await loop.run_in_executor(self._pool, self._prepare_inputs, inputs)
        elif stream is not None and stream.sequential and self.cache is None and expect_sha256 is None:
            values, digests = normalize_inputs(self.graph, inputs), {}  # a chunk: no response carries digests
        else:
            values, digests = self._prepare_inputs(inputs)
        check_expected(digests, expect_sha256)
        modalities = sorted(self.graph.inputs[n].modality.value for n in values)
        integrity = {n: f"sha256:{d}" for n, d in digests.items()}
        for obs in self.observers:
            obs.request_started(rid, modalities)
            obs.request_integrity(rid, integrity)
        t0 = time.perf_counter()
        self._inflight += 1
        status = "error"
        pruned: list[str] = []
        try:
            deadline = self.timeout_s if timeout_s is None else timeout_s
            try:
                async with asyncio.timeout(deadline):
                    result = await self._run(rid, values, digests, events, stream or StreamState())
            except TimeoutError:
                status = "timeout"
                raise RequestTimeout(
                    f"request {rid} did not finish within {deadline:g} s; fix: raise the timeout, "
                    "or check `usg doctor` / the metrics for a slow model"
                ) from None
            status = "ok"
            pruned = result.pruned_nodes
            return result
        finally:
            self._inflight -= 1
            for obs in self.observers:
                obs.request_finished(rid, modalities, time.perf_counter() - t0, status, pruned)

    async def run_chunk(self, inputs: Mapping[str, Any], stream: StreamState, request_id: str) -> InferResult:
        """Run one chunk of a sequential stream (a session's) whose values were checked when it
        was sent (decoded audio: :func:`usg.stream.session.check_audio_chunk`; a flush run's empty
        arrays): the lean run of :mod:`usg.runtime.chunks`, with the events and errors of
        :meth:`infer`, which runs it instead when a node cache is on or the inputs need it."""
        if self.state is not ExecutorState.RUNNING or self.cache is not None or not stream.sequential:
            return await self.infer(inputs, stream=stream, request_id=request_id)
        key = frozenset(inputs)
        plan = self._chunk_plans.get(key)
        if plan is None and key not in self._chunk_plans:
            plan = self._chunk_plans[key] = plan_chunk(self.graph, key, self.plan, self._inline_fns)
        if plan is None:  # an unknown or missing input: infer raises the error
            return await self.infer(inputs, stream=stream, request_id=request_id)
        return await run_chunk(self, plan, dict(inputs), stream, request_id)

    def stream(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        request_id: str | None = None,
        expect_sha256: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run one request, yielding each node that finished and LLM token deltas as they happen,
        then :class:`~usg.runtime.events.Finished` with the result :meth:`infer` returns (its
        errors are raised from the iterator). Closing the iterator early cancels the request,
        and with it the engine requests of its LLM nodes."""
        return stream_events(
            lambda sink: self.infer(
                inputs, timeout_s=timeout_s, request_id=request_id, expect_sha256=expect_sha256, events=sink
            )
        )

    async def _run(
        self,
        rid: str,
        values: dict[str, Any],
        digests: dict[str, str],
        events: EventSink | None = None,
        stream: StreamState | None = None,
    ) -> InferResult:
        active, pruned = self.plan(set(values))
        state = Request(rid, values, stream or StreamState(), emit=events)
        if self.cache is not None:  # hits fill outputs; nodes only they needed do not run
            state.cache = await self.cache.begin(active, digests)
            state.outputs.update(state.cache.hits)
        skip = state.cache.skip if state.cache is not None else set()
        ran = [name for name in active if name not in skip]
        try:
            decode = self._inputs_to_decode(state, active, skip)
            if decode:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._pool, decode_pending, self.graph, state.values, decode)
            if state.stream.sequential or self._chain(ran):  # one after the other, no task each:
                for name in ran:  # a session's chunk, or nodes each waiting for the one before
                    await self._run_node(state, name)
            else:
                for name in ran:
                    state.tasks[name] = asyncio.create_task(self._run_node(state, name), name=f"{rid}:{name}")
                await asyncio.gather(*state.tasks.values())
        finally:
            for t in state.tasks.values():
                if not t.done():
                    t.cancel()
            if state.tasks:  # let cancelled tasks finish so no "Task was destroyed" warnings leak
                await asyncio.gather(*state.tasks.values(), return_exceptions=True)
            if self.cache is not None and state.cache is not None:
                self.cache.finish(state.cache)
        for obs in self.observers:
            obs.request_values(rid, state.values, state.outputs)
        skipped = [n for n in ran if state.outputs.get(n) is None]
        all_pruned = sorted(set(pruned) | set(skipped), key=self.graph.order.index)
        integrity = {n: f"sha256:{d}" for n, d in digests.items()}
        return InferResult(state.graph_outputs(self.graph), all_pruned, state.node_ms, rid, integrity)

    async def _run_node(self, state: Request, name: str) -> None:
        node = self.graph.nodes[name]
        if state.tasks:  # run as tasks (not one after the other): wait for the upstream nodes' tasks
            sources = {r.source for r in node.inputs.values() if not r.is_graph_input}
            deps = [state.tasks[s] for s in sources if s in state.tasks]  # a cache hit has no task
            if deps:
                await asyncio.gather(*deps)
        args = state.node_args(node)
        if args is None:  # an upstream was skipped, or said "nothing here": skip this branch
            state.outputs[name] = None
            if self.cache is not None and state.cache is not None:
                await self.cache.store(state.cache, name, None)
            return
        start = time.perf_counter()
        timing = ItemTiming()
        items = 1
        ok = False
        try:
            if node.model is not None:
                on_token = state.token_callback(name)
                state.outputs[name], items = await self._run_model_node(node, args, timing, state.stream, on_token)
            else:
                state.outputs[name], items = await self._run_fn_node(node, args, state.stream)
            ok = True
            if self.cache is not None and state.cache is not None:
                await self.cache.store(state.cache, name, state.outputs[name])
        except USGError as exc:
            if exc.node is None:  # the first node that failed names itself (HTTP bodies carry it)
                exc.node = name
            raise
        finally:
            end = time.perf_counter()
            state.node_ms[name] = (end - start) * 1e3
            if self.observers:
                self._node_finished(state.rid, node, start, end, timing, items, ok)
        if state.emit is not None:
            state.emit(NodeFinished(name, state.node_ms[name]))

    def _node_finished(
        self, rid: str, node: NodeDef, start: float, end: float, timing: ItemTiming | None, items: int, ok: bool
    ) -> None:
        """Tell the observers a node ran (``timing``: where its items' time went)."""
        t = timing or ItemTiming()
        calls = tuple(t.engine_calls)
        event = NodeEvent(rid, node.name, node.kind, node.model, start, end, t.queue_ms, t.compute_ms, items, ok, calls)
        for obs in self.observers:
            obs.node_finished(event)

    async def _run_fn_node(
        self, node: NodeDef, args: dict[str, Any], stream: StreamState
    ) -> tuple[dict[str, Any], int]:
        func = self._fns[node.name]
        names, _ = self._fn_params[node.name]
        opts = dict(self._fn_opts[node.name])
        opts.update(stream.node_params(node.name, names))
        loop = asyncio.get_running_loop()
        sent = self._deferred.get(node.name) if self._deferred and not self._observers_read_values else None
        call = call_fn if sent is None else functools.partial(call_deferring, sent)
        if not node.map:
            inline = self._fn_inline.get(node.name)
            if inline is not None and inline(args):
                return call(node, func, args, opts), 1
            return await loop.run_in_executor(self._pool, call, node, func, args, opts), 1
        per_item = split_map(node, args, self.graph.limits.max_fanout_items)

        def call_all() -> dict[str, Any]:
            results = [call(node, func, a, opts) for a in per_item]
            if not results:
                return EmptyFanOut()
            return {k: [r[k] for r in results] for k in results[0]}

        return await loop.run_in_executor(self._pool, call_all), len(per_item)

    async def _run_model_node(
        self,
        node: NodeDef,
        args: dict[str, Any],
        timing: ItemTiming | None,
        stream: StreamState,
        on_token: TokenCallback | None = None,
    ) -> tuple[dict[str, Any], int]:
        """Run a model node: :meth:`usg.runtime.model_nodes.ModelNodes.run`."""
        return await self._model_nodes.run(node, args, timing, stream, on_token)

    # -- sync facade -------------------------------------------------------------------------
    def start_sync(self) -> None:
        self._sync.run(self.start())

    def infer_sync(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        expect_sha256: Mapping[str, str] | None = None,
    ) -> InferResult:
        """Blocking :meth:`infer` for scripts and the CLI (runs an event loop in a background thread)."""
        return self._sync.run(self.infer(inputs, timeout_s=timeout_s, expect_sha256=expect_sha256))

    def stream_sync(
        self,
        inputs: Mapping[str, Any],
        on_event: Callable[[ExecutionEvent], None],
        *,
        timeout_s: float | None = None,
    ) -> InferResult:
        """Blocking :meth:`stream`: ``on_event`` gets each event (on the loop's thread) as it
        happens; returns the result (``usg run --stream``)."""

        async def consume() -> InferResult:
            async for event in self.stream(inputs, timeout_s=timeout_s):
                on_event(event)
                if isinstance(event, Finished):
                    return event.result
            raise AssertionError("a stream ends with Finished or an error")

        return self._sync.run(consume())

    def close(self) -> None:
        """Blocking :meth:`aclose`; also stops the background loop of the sync facade."""
        if self._sync.started:
            self._sync.run(self.aclose())
            self._sync.stop()
        elif self.state is not ExecutorState.CLOSED:
            asyncio.run(self.aclose())

    def __enter__(self) -> Executor:
        self.start_sync()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
