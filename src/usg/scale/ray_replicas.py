"""What runs inside a model or Python-node deployment on Ray Serve.

A model replica loads the same backend the in-process executor would
(:func:`usg.runtime.runner.backend_for`) and batches calls with ``@serve.batch`` sized from the
model's batch policy (max size, wait, concurrent batches = ``options.concurrency``), the cap and
wait then set by the dynamic batch controller where the in-process batcher would run it; a batch
is split into shape-compatible groups and run by :func:`usg.runtime.kernel.run_items`
(the in-process batcher's kernel: padding, poison isolation, call deadline), and each backend call's
:class:`~usg.records.BatchEvent` travels back in a :class:`~usg.scale.reply.ReplicaReply`
for the router's metrics. An engine model (``backend: openai`` with ``own_deployment: true``)
is called through :meth:`ModelReplica.generate`, a streaming method: its token deltas as the
engine sends them, then the reply (the router stopping early cancels the engine request).
A node replica calls the node's Python function. Both return USG
errors as values, so the router re-raises the original error type instead of a wrapped
``RayTaskError``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from ray import serve

from usg.callables import accepted_params, import_callable
from usg.errors import BackendError, USGError
from usg.graph.model import ModelDef, NodeDef
from usg.records import BatchEvent, ItemTiming
from usg.runtime.batcher import controlled
from usg.runtime.controller import BatchController
from usg.runtime.kernel import BatchKernel, call_with_deadline, run_items, timeout_error
from usg.runtime.runner import backend_for, concurrency_for
from usg.scale.reply import ReplicaReply
from usg.scale.transport import Reducer
from usg.specs import TensorSpec

__all__ = ["FnReplica", "ModelReplica"]

_DONE = object()


class ModelReplica:
    def __init__(self, model: ModelDef, reducers: Mapping[str, Reducer] | None = None) -> None:
        self.model = model
        # output port -> reducer applied before replying (usg.scale.transport.output_reducers)
        self.reducers = {
            port: functools.partial(import_callable(r.fn), **r.options) for port, r in (reducers or {}).items()
        }
        self.backend = backend_for(model)
        self.backend.load()
        self.batching = model.batch.enabled
        concurrency = concurrency_for(model, self.backend)
        # @serve.batch built per replica from the graph's policy: max size, wait, and as many
        # batches in flight as the model's options.concurrency (its in-process instance count)
        self._batched: Any = serve.batch(
            max_batch_size=model.batch.max_size,
            batch_wait_timeout_s=model.batch.max_delay_ms / 1e3,
            max_concurrent_batches=concurrency,
        )(self._run_batch)
        self._calls = asyncio.Semaphore(concurrency)
        self._timeout_s = model.call_timeout_s
        self._kernel = BatchKernel(
            model.name,
            self.backend,
            model.batch.pad,
            call_timeout_s=self._timeout_s,
            max_parallel_retries=model.batch.max_size,
            state=model.state,  # the state travels with each item: any replica can run any stream
        )
        self._items = 0
        self._backend_calls = 0
        # the dynamic batch controller, as in-process (usg.runtime.controller): on where the
        # batcher would turn it on; it sets @serve.batch's cap and wait from the calls it sees
        self.controller = (
            BatchController(model.name, model.batch)
            if self.batching and controlled(model.batch, self.backend)
            else None
        )
        self._queued = 0  # items handed to @serve.batch and not yet in a batch (the queue's depth)

    def stats(self) -> dict[str, int]:
        """Items this replica ran and backend calls it made (items / calls = mean batch size)."""
        return {"items": self._items, "calls": self._backend_calls}

    def specs(self) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
        return dict(self.backend.input_specs), dict(self.backend.output_specs)

    async def __call__(self, item: Mapping[str, Any]) -> ReplicaReply:
        if self.batching:
            self._queued += 1
            reply: ReplicaReply = await self._batched((item, time.perf_counter()))
            return reply
        async with self._calls:
            self._items += 1
            self._backend_calls += 1
            t0 = time.perf_counter()
            try:
                out: dict[str, Any] | USGError = await call_with_deadline(
                    None, self.backend, self.model.name, item, self._timeout_s
                )
            except USGError as exc:
                out = exc
            return ReplicaReply(self._reduce(out), compute_ms=(time.perf_counter() - t0) * 1e3)

    async def generate(self, item: Mapping[str, Any], tokens: bool = True) -> AsyncIterator[str | ReplicaReply]:
        """One item of an engine model as it generates: each token delta (``tokens``), then its
        :class:`ReplicaReply` (with the engine requests made). Closing this generator (the
        router's client went away) cancels the engine request, which closes its stream."""
        # no concurrency gate here: the backend holds at most options.max_inflight at the engine
        queue: asyncio.Queue[object] = asyncio.Queue()
        timing = ItemTiming()
        self._items += 1
        self._backend_calls += 1
        t0 = time.perf_counter()
        task = asyncio.ensure_future(self._generate(item, queue.put_nowait if tokens else None, timing))
        task.add_done_callback(lambda _t: queue.put_nowait(_DONE))
        try:
            while (piece := await queue.get()) is not _DONE:
                assert isinstance(piece, str)
                yield piece
            out = task.result()
            now = time.perf_counter()
            yield ReplicaReply(
                self._reduce(out), compute_ms=(now - t0) * 1e3, engine_calls=tuple(timing.engine_calls), clock=now
            )
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _generate(
        self, item: Mapping[str, Any], on_token: Callable[[str], None] | None, timing: ItemTiming
    ) -> dict[str, Any] | USGError:
        try:
            async with asyncio.timeout(self._timeout_s):
                if on_token is None:
                    return await self.backend.ainfer(item, timing)
                return await self.backend.astream(item, on_token, timing)
        except TimeoutError:
            return timeout_error(self.model.name, self._timeout_s or 0.0, 1)
        except USGError as exc:
            return exc
        except Exception as exc:
            return BackendError(f"model {self.model.name!r} raised {type(exc).__name__}: {exc}")

    def _reduce(self, out: dict[str, Any] | USGError) -> dict[str, Any] | USGError:
        if not self.reducers or isinstance(out, USGError):
            return out
        out = dict(out)
        for port, fn in self.reducers.items():
            name = port if port in out else (next(iter(out)) if port == "out" and len(out) == 1 else None)
            if name is not None:
                out[name] = fn(out[name])
        return out

    async def many(self, items: Sequence[Mapping[str, Any]]) -> list[ReplicaReply]:
        """A map node's items from one request: each joins the batcher like a single call."""
        return list(await asyncio.gather(*(self(item) for item in items)))

    async def _run_batch(self, entries: list[tuple[Mapping[str, Any], float]]) -> list[ReplicaReply]:
        started = time.perf_counter()
        if self.controller is not None:
            self.controller.formed(self._queued)
        self._queued = max(0, self._queued - len(entries))
        items = [item for item, _ in entries]
        waits = [(started - enqueued) * 1e3 for _, enqueued in entries]
        results, calls = await run_items(self._kernel, items, waits)
        self._items += len(items)
        self._backend_calls += len(calls)
        if self.controller is not None:
            for call in calls:
                self.controller.observe(call.event)
            self._batched.set_max_batch_size(self.controller.cap)
            self._batched.set_batch_wait_timeout_s(self.controller.wait_ms / 1e3)
        # each call's event rides back with the first item it ran, so the router counts it once;
        # every item carries the compute and size of the (last) call that ran it
        events: dict[int, list[BatchEvent]] = {}
        ran_by: dict[int, BatchEvent] = {}
        for call in calls:
            events.setdefault(call.indices[0], []).append(call.event)
            for i in call.indices:
                ran_by[i] = call.event
        return [
            ReplicaReply(
                self._reduce(out),
                tuple(events.get(i, ())),
                compute_ms=ran_by[i].compute_ms if i in ran_by else 0.0,
                batch_size=ran_by[i].items if i in ran_by else 1,
            )
            for i, out in enumerate(results)
        ]


class FnReplica:
    def __init__(self, node: NodeDef) -> None:
        assert node.fn is not None
        self.node = node
        self.func = import_callable(node.fn)
        self.names, self.var_kw = accepted_params(self.func)

    def _call(self, kwargs: Mapping[str, Any]) -> Any:
        # the router passes the node's inputs and all its options: keep the options it accepts,
        # as the in-process executor does (inputs were checked against the signature at load)
        options = set(self.node.options)
        args = {k: v for k, v in kwargs.items() if self.var_kw or k in self.names or k not in options}
        try:
            return self.func(**args)
        except USGError as exc:
            return exc
        except Exception as exc:
            return BackendError(f"node {self.node.name!r} (fn {self.node.fn}) raised {type(exc).__name__}: {exc}")

    async def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        return await asyncio.to_thread(self._call, kwargs)
