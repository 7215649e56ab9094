"""Build-time validation: collect every problem of a graph and raise them once.

Checks: unknown references, node kinds, importable functions, cycles, missing
model files, ONNX input/output names vs the wiring, and dtype / rank /
fixed-dim compatibility across every edge whose two ends declare a spec.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from usg.callables import accepted_params, import_callable
from usg.errors import GraphError, GraphProblem
from usg.graph.cache import CacheSpec
from usg.graph.catalog import ModelIO, model_kinds
from usg.graph.deploy import DeploySpec
from usg.graph.limits import GraphLimits
from usg.graph.model import Graph, InputDef, ModelDef, NodeDef, Ref, model_output, wireable_outputs
from usg.graph.options import model_option_problems, onnxruntime_option_problems
from usg.graph.state import state_problems
from usg.ops.signature import ListOf, PortSpec, signature_of
from usg.specs import TensorSpec, merge_declared

__all__ = ["ModelIO", "describe_model", "validate_graph"]

# parameters the executor passes to a Python node's function of its own when the function names
# them (usg.runtime.streams.StreamState.node_params): never wired
_STREAM_PARAMS = frozenset({"session_state", "ts_ms", "flush"})


def describe_model(model: ModelDef) -> ModelIO | None:
    """Input/output specs a model's file declares (tightened by the graph's declared input
    specs), without loading a session; None when its backend kind cannot say."""
    kind = model_kinds().get(model.backend)
    if kind is None or kind.describe is None:
        return None
    io = kind.describe(model.path)
    if io is None:
        return None
    return merge_declared(io[0], model.input_specs), dict(io[1])


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    listed = ", ".join(sorted(options)) or "(none)"
    return f"did you mean {close[0]!r}? known: {listed}" if close else f"known: {listed}"


def _toposort(nodes: Mapping[str, NodeDef]) -> tuple[list[str], list[list[str]]]:
    """Kahn's order plus the cycles found among the nodes left over."""
    deps = {n: {r.source for r in d.inputs.values() if r.source in nodes} for n, d in nodes.items()}
    order: list[str] = []
    ready = [n for n in nodes if not deps[n]]
    remaining = {n: set(s) for n, s in deps.items()}
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m, s in remaining.items():
            if n in s:
                s.discard(n)
                if not s and m not in order and m not in ready:
                    ready.append(m)
    left = [n for n in nodes if n not in order]
    cycles: list[list[str]] = []
    seen: set[str] = set()
    for start in left:
        if start in seen:
            continue
        path = [start]
        cur = start
        while True:
            nxt = sorted(s for s in deps[cur] if s in left)
            if not nxt:
                break
            cur = nxt[0]
            if cur in path:
                cyc = [*path[path.index(cur) :], cur]
                if not seen.intersection(cyc):
                    cycles.append(cyc)
                seen.update(cyc)
                break
            path.append(cur)
    return order, cycles


class _Validator:
    def __init__(
        self,
        name: str,
        inputs: dict[str, InputDef],
        models: dict[str, ModelDef],
        nodes: dict[str, NodeDef],
        outputs: dict[str, Ref],
    ) -> None:
        self.name, self.inputs, self.models, self.nodes, self.outputs = name, inputs, models, nodes, outputs
        self.problems: list[GraphProblem] = []
        self.reported: set[str] = set()  # where the loader already found problems
        self.model_io: dict[str, ModelIO | None] = {}
        self.fn_sigs: dict[str, Any] = {}
        self.fn_dir: Path | None = None  # the graph file's folder: modules next to it import

    def add(self, where: str, message: str, fix: str) -> None:
        self.problems.append(GraphProblem(where, message, fix))

    def run(self) -> list[str]:
        self._models()
        self._node_kinds()
        self._references()
        order, cycles = _toposort(self.nodes)
        for cyc in cycles:
            self.add(
                "nodes",
                f"cycle: {' -> '.join(cyc)}",
                f"break the cycle: one of {', '.join(sorted(set(cyc)))} must not depend on the others",
            )
        self._model_ports()
        self._edges()
        return order

    def _models(self) -> None:
        kinds = model_kinds()
        for m in self.models.values():
            where = f"models.{m.name}"
            kind = kinds.get(m.backend)
            if kind is None:
                self.add(
                    f"{where}.backend",
                    f"unknown backend {m.backend!r}",
                    f"use one of: {', '.join(sorted(kinds))}",
                )
                continue
            self.problems += model_option_problems(where, m.options)
            if m.backend == "onnxruntime":
                self.problems += onnxruntime_option_problems(where, m.options)
            if kind.needs_path:
                # a path the loader could not resolve is reported already, as models.NAME.path
                if m.path is None and f"{where}.path" not in self.reported:
                    self.add(
                        where,
                        "no path given",
                        "add path: FILE (relative to the graph file, or pkg://PACKAGE/FILE)",
                    )
                elif m.path is not None and not m.path.is_file():
                    fix = "check the path; relative paths are resolved against the graph file's folder"
                    if m.export:
                        exporter = m.export.get("exporter", "?")
                        fix = f"run `usg export {exporter} --output {m.path}` (or `usg run` exports it)"
                    self.add(f"{where}.path", *_not_a_model_file(m.path, fix))
            try:
                self.model_io[m.name] = describe_model(m)
            except Exception as exc:  # a corrupt ONNX file
                self.add(
                    f"{where}.path",
                    f"cannot read model {m.path}: {exc}",
                    "re-export the model; `usg doctor FILE` says what is wrong with it",
                )
                self.model_io[m.name] = None
            io = self.model_io[m.name]
            if m.state is not None and io is not None:
                self.problems += state_problems(f"{where}.state", m.state, io[0], io[1])

    def _node_kinds(self) -> None:
        for n in self.nodes.values():
            where = f"nodes.{n.name}"
            if n.model is not None and n.model not in self.models:
                self.add(f"{where}.model", f"unknown model {n.model!r}", _suggest(n.model, list(self.models)))
            if n.fn is not None:
                try:
                    func = import_callable(n.fn, self.fn_dir)
                except ValueError as exc:
                    self.add(f"{where}.fn", str(exc), "point fn at an importable 'package.module:function'")
                else:
                    self.fn_sigs[n.name] = signature_of(func)
                    self._fn_params(n, func)
            for port in n.map:
                if port not in n.inputs:
                    self.add(
                        f"{where}.map",
                        f"maps over {port!r}, which is not one of its inputs",
                        _suggest(port, list(n.inputs)),
                    )

    def _fn_params(self, n: NodeDef, func: Any) -> None:
        """The node's wiring against its function's parameters: the executor calls it with each
        wired input port as a keyword argument (plus the options it names and the stream
        parameters it declares), so a port it does not take, or a parameter without a default that
        nothing supplies, fails every request with a TypeError — say so here, at build time."""
        try:
            names, var_kw = accepted_params(func)
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function without a signature: cannot tell
            return
        where = f"nodes.{n.name}"
        if not var_kw:
            for port in n.inputs:
                if port not in names:
                    self.add(
                        f"{where}.inputs.{port}",
                        f"fn {n.fn!r} takes no argument {port!r}, so every call would fail",
                        f"wire one of its parameters instead: {_suggest(port, sorted(names - set(n.options)))}",
                    )
        supplied = set(n.inputs) | set(n.options) | _STREAM_PARAMS
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in supplied:
                self.add(
                    f"{where}.inputs",
                    f"fn {n.fn!r} needs argument {p.name!r}, which is neither wired nor in the node's options",
                    f"add {p.name}: NODE.PORT (or inputs.NAME) under {where}.inputs, or {p.name} under its options",
                )

    def out_ports(self, node: str) -> list[str] | None:
        n = self.nodes[node]
        if n.model is not None:
            io = self.model_io.get(n.model)
            if io is None:
                return None
            model = self.models.get(n.model)
            hidden = model.state.outputs if model is not None and model.state is not None else set()
            return wireable_outputs([o for o in io[1] if o not in hidden])
        sig = self.fn_sigs.get(node)
        return None if sig is None or not sig.outputs else list(sig.outputs)

    def _check_ref(self, where: str, ref: Ref) -> None:
        if ref.is_graph_input:
            if ref.port not in self.inputs:
                self.add(where, f"unknown graph input {str(ref)!r}", _suggest(ref.port, list(self.inputs)))
            return
        if ref.source not in self.nodes:
            self.add(
                where,
                f"unknown node {ref.source!r} in {str(ref)!r}",
                _suggest(ref.source, [*self.nodes, "inputs"]),
            )
            return
        ports = self.out_ports(ref.source)
        if ports is not None and ref.port not in ports:
            self.add(where, f"node {ref.source!r} has no output {ref.port!r}", _suggest(ref.port, ports))

    def _references(self) -> None:
        for n in self.nodes.values():
            for port, ref in n.inputs.items():
                self._check_ref(f"nodes.{n.name}.inputs.{port}", ref)
        for oname, ref in self.outputs.items():
            self._check_ref(f"outputs.{oname}", ref)

    def _model_ports(self) -> None:
        for n in self.nodes.values():
            if n.model is None or self.model_io.get(n.model) is None:
                continue
            ins = self.model_io[n.model][0]  # type: ignore[index]
            state = self.models[n.model].state
            if state is not None:
                for port in n.inputs:
                    if port in state.pairs:
                        self.add(
                            f"nodes.{n.name}.inputs.{port}",
                            f"input {port!r} is the state of model {n.model!r}; the executor feeds it per stream",
                            f"remove {port} from nodes.{n.name}.inputs",
                        )
                ins = {k: v for k, v in ins.items() if k not in state.pairs}
            for port in n.inputs:
                if port not in ins and (state is None or port not in state.pairs):
                    self.add(
                        f"nodes.{n.name}.inputs.{port}",
                        f"model {n.model!r} has no input {port!r}",
                        _suggest(port, list(ins)),
                    )
            for required in ins:
                if required not in n.inputs:
                    self.add(
                        f"nodes.{n.name}.inputs",
                        f"model {n.model!r} input {required!r} ({ins[required].describe()}) is not wired",
                        f"add {required}: NODE.PORT under nodes.{n.name}.inputs",
                    )

    def producer_spec(self, ref: Ref) -> PortSpec:
        if ref.is_graph_input:
            d = self.inputs.get(ref.port)
            return None if d is None else d.spec
        n = self.nodes.get(ref.source)
        if n is None:
            return None
        if n.model is not None:
            io = self.model_io.get(n.model)
            if io is None:
                return None
            outs = io[1]
            spec = outs.get(model_output(ref.port, outs))
            return ListOf(spec) if n.map else spec
        sig = self.fn_sigs.get(n.name)
        spec = None if sig is None else sig.outputs.get(ref.port)
        if n.map and not isinstance(spec, ListOf):
            return ListOf(spec if isinstance(spec, TensorSpec) else None)
        return spec

    def consumer_spec(self, node: NodeDef, port: str) -> PortSpec:
        if node.model is not None:
            io = self.model_io.get(node.model)
            return None if io is None else io[0].get(port)
        sig = self.fn_sigs.get(node.name)
        return None if sig is None else sig.inputs.get(port)

    def _edges(self) -> None:
        for n in self.nodes.values():
            for port, ref in n.inputs.items():
                where = f"nodes.{n.name}.inputs.{port}"
                prod = self.producer_spec(ref)
                cons = self.consumer_spec(n, port)
                if port in n.map:
                    if isinstance(prod, TensorSpec):
                        self.add(
                            where,
                            f"map over {ref}, which is a single tensor ({prod.describe()}), not a list",
                            f"remove map for {port!r}, or wire a port that returns a list",
                        )
                        continue
                    prod = prod.item if isinstance(prod, ListOf) else None
                elif isinstance(prod, ListOf) and isinstance(cons, TensorSpec):
                    self.add(
                        where,
                        f"{ref} is a list, but {n.name}.{port} takes one tensor ({cons.describe()})",
                        f"add map: {port} to nodes.{n.name} to run it once per item",
                    )
                    continue
                if isinstance(cons, ListOf):
                    cons = None if isinstance(prod, ListOf) else cons
                if isinstance(prod, TensorSpec) and isinstance(cons, TensorSpec):
                    issues = prod.compatible_with(cons)
                    if issues:
                        self.add(
                            where,
                            f"{ref} ({prod.describe()}) -> {n.name}.{port} ({cons.describe()}): {'; '.join(issues)}",
                            _edge_fix(prod, cons, ref),
                        )


def _edge_fix(prod: TensorSpec, cons: TensorSpec, ref: Ref) -> str:
    if prod.rank == 3 and cons.rank == 4 and prod.dtype == "uint8":
        return (
            f"insert a preprocessing node between {ref} and the model: convert {prod.layout or 'HWC'} "
            f"uint8 to {cons.dtype} {cons.layout or 'NCHW'} (scale, transpose, add the batch axis), "
            "e.g. fn: usg.ops.image:to_nchw_float"
        )
    if prod.dtype != cons.dtype and prod.rank == cons.rank:
        return f"cast {ref} to {cons.dtype} in the producing node, or insert a node that does"
    return f"make {ref} produce {cons.describe()}, or insert a node that converts it"


def validate_graph(
    name: str,
    inputs: dict[str, InputDef],
    models: dict[str, ModelDef],
    nodes: dict[str, NodeDef],
    outputs: dict[str, Ref],
    *,
    source: Path | None = None,
    limits: GraphLimits | None = None,
    problems: list[GraphProblem] | None = None,
    deploy: DeploySpec | None = None,
    cache: CacheSpec | None = None,
) -> Graph:
    """Validate the parts and return a :class:`Graph`, or raise one GraphError listing every problem."""
    v = _Validator(name, inputs, models, nodes, outputs)
    v.reported = {p.where for p in problems or ()}
    v.fn_dir = source.parent if source is not None else None
    order = v.run()
    all_problems = list(problems or []) + v.problems
    if all_problems:
        raise GraphError(all_problems, source=str(source) if source else name)
    return Graph(
        name,
        inputs,
        models,
        nodes,
        outputs,
        source=source,
        order=tuple(order),
        limits=limits or GraphLimits(),
        deploy=deploy or DeploySpec(),
        cache=cache,
    )


def _not_a_model_file(path: Path, fix: str) -> tuple[str, str]:
    """What is at a model path that is not a regular file, and the fix ("does not exist" only when nothing is)."""
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".onnx", ".json"))[:5]
        hint = f" (model files in it: {', '.join(inside)})" if inside else ""
        return f"model path {path} is a directory, not a model file{hint}", "point path at the model file inside it"
    if path.exists():
        return f"model path {path} is not a regular file (a device, pipe or socket)", "point path at the model file"
    return f"model file {path} does not exist", fix
