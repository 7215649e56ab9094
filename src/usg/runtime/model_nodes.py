"""Model nodes of an executor's graph: their items prepared, submitted and gathered.

:class:`ModelNodes` runs one model node's call for :class:`usg.runtime.Executor` (and the lean
chunk runs of :mod:`usg.runtime.chunks`, through the executor): each item is checked against the
model's input contract (:mod:`usg.runtime.contract`) and, while the executor defers values to
remote models (:mod:`usg.runtime.deferral`), guarded against placeholders; a map node's arguments
split into items (:func:`split_map`) whose outputs are gathered into lists; a stateful model's
items take the stream's state one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usg.backends import Backend
from usg.errors import BackendError, PayloadTooLarge
from usg.graph.model import Graph, NodeDef, model_output, wireable_outputs
from usg.ops.wire import check_not_placeholder
from usg.records import ItemTiming
from usg.runtime.contract import InputCheck, model_input_specs
from usg.runtime.events import TokenCallback
from usg.runtime.request import aliased
from usg.runtime.runner import ModelRunner
from usg.runtime.streams import StreamState
from usg.specs import TensorSpec

__all__ = ["ModelNodes", "split_map"]


def split_map(node: NodeDef, args: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """A map node's arguments as one dict per item (``limit``: the graph's ``limits.max_fanout_items``)."""
    lengths = {p: len(args[p]) for p in node.map}
    if len(set(lengths.values())) > 1:
        raise BackendError(
            f"node {node.name!r} maps over lists of different lengths {lengths}; "
            "fix: make the upstream nodes return lists of equal length"
        )
    n = next(iter(lengths.values()), 0)
    if n > limit:
        raise PayloadTooLarge(
            f"node {node.name!r} would fan out to {n} items, above the graph's limit of {limit} "
            "(limits.max_fanout_items)",
            field=node.name,
            fix="send a smaller input, or raise limits.max_fanout_items in the graph",
        )
    return [{p: (args[p][i] if p in node.map else args[p]) for p in args} for i in range(n)]


class ModelNodes:
    """Runs the model nodes of ``graph`` on the executor's ``backends`` and ``runners`` (its own
    dicts, filled as it starts: :meth:`add` each model once its backend is loaded)."""

    def __init__(self, graph: Graph, backends: Mapping[str, Backend], runners: Mapping[str, ModelRunner]) -> None:
        self.graph = graph
        self._backends = backends
        self._runners = runners
        #: the executor defers values to remote models (usg.runtime.deferral): guard the local ones
        self.deferring = False
        self._checks: dict[str, InputCheck] = {}  # model node -> its input contract check
        self._in_specs: dict[str, Mapping[str, TensorSpec]] = {}
        self._out_names: dict[str, list[str]] = {}
        self._map_ports: dict[str, list[tuple[str, str]]] = {}

    def add(self, name: str, backend: Backend) -> None:
        """Model ``name``'s input contract and visible outputs, from its loaded ``backend``."""
        model = self.graph.models[name]
        self._in_specs[name] = model_input_specs(backend.input_specs, model.input_specs)
        hidden = model.state.outputs if model.state is not None else set()
        self._out_names[name] = [o for o in backend.output_specs if o not in hidden]

    async def run(
        self,
        node: NodeDef,
        args: dict[str, Any],
        timing: ItemTiming | None,
        stream: StreamState,
        on_token: TokenCallback | None = None,
    ) -> tuple[dict[str, Any], int]:
        """Run a model node (``on_token``: the caller streams; a map node's items stream no tokens,
        as their deltas would interleave). ``args`` is the node's own dict (built per run): its
        items are prepared in place. ``timing`` None: nobody reads the node's times."""
        assert node.model is not None
        runner = self._runners[node.model]
        out_names = self._out_names[node.model]
        stateful = self.graph.models[node.model].state is not None
        check = self._checks.get(node.name)
        if check is None:
            check = self._checks[node.name] = InputCheck(node.name, node.model, self._in_specs[node.model])

        # while this executor defers values to remote models, a local model must not get a placeholder
        # (its backend reads the memory directly, past the placeholder's hooks: zeros); usg.runtime.deferral
        guard = self.deferring and not self._backends[node.model].ships_derived

        def prepare(item: dict[str, Any]) -> dict[str, Any]:
            for p, v in item.items():
                if isinstance(v, str):
                    item[p] = [v]
                elif guard:
                    check_not_placeholder(
                        v, f"node {node.name!r} (model {node.model!r}, read in this process) input {p!r}"
                    )
            check(item)
            return item

        if not node.map:
            if stateful:
                out = (await self._submit_stateful_items(node, [prepare(args)], stream, [timing]))[0]
            else:
                out = await runner.submit(prepare(args), timing, on_token)
            return aliased(out, out_names), 1
        items = [prepare(a) for a in split_map(node, args, self.graph.limits.max_fanout_items)]
        timings: list[ItemTiming | None] = [ItemTiming() for _ in items] if timing is not None else [None] * len(items)
        if stateful:  # one stream: its items run one after the other, each on the state the last left
            outs = await self._submit_stateful_items(node, items, stream, timings)
        else:
            outs = await runner.submit_many(items, timings)
        if timing is not None:
            done = [t for t in timings if t is not None]
            timing.queue_ms = sum(t.queue_ms for t in done)
            timing.compute_ms = sum(t.compute_ms for t in done)
            timing.engine_calls.extend(c for t in done for c in t.engine_calls)
        gathered = {k: [o[real] for o in outs] for k, real in self._gathered_ports(node.model)}
        return gathered, len(items)

    def _gathered_ports(self, model: str) -> list[tuple[str, str]]:
        """A map node's outputs over ``model``: each port a wire may name, and the output it reads."""
        ports = self._map_ports.get(model)
        if ports is None:
            out_names = self._out_names[model]
            ports = self._map_ports[model] = [(k, model_output(k, out_names)) for k in wireable_outputs(out_names)]
        return ports

    async def _submit_stateful_items(
        self, node: NodeDef, items: list[dict[str, Any]], stream: StreamState, timings: list[ItemTiming | None]
    ) -> list[dict[str, Any]]:
        """Items of a stateful model (each its own dict), one after the other: each takes the
        stream's state, and the next state it returns is stored back before the next item."""
        assert node.model is not None
        spec = self.graph.models[node.model].state
        assert spec is not None
        name = node.name
        current = stream.models.get(name)
        if current is None:
            backend_specs = self._backends[node.model].input_specs
            current = {src: spec.initial(backend_specs[src]) for src in spec.pairs}
        submit = self._runners[node.model].submit
        pairs = spec.pairs.items()
        outs = []
        for item, timing in zip(items, timings, strict=True):
            item.update(current)
            out = await submit(item, timing)
            current = stream.models[name] = {src: out.pop(dst) for src, dst in pairs}
            outs.append(out)
        return outs
