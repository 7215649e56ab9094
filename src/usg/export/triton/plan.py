"""Decide how a graph becomes a Triton repository: which models, their names, ensemble or BLS.

The graph is an **ensemble** when Triton can run it step by step on its own: every graph input
is required (no modality branch to prune), no node maps over a list, every model declares its
tensors, and every value that crosses between nodes (or leaves the graph) is a tensor with a
dtype and a rank. Otherwise it is a **BLS** Python model that runs the USG executor, which
calls the exported models through Triton. :func:`plan_export` returns the decision with every
reason against an ensemble, so the CLI can say why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from usg.backends.python_fn import import_callable
from usg.errors import UsageError
from usg.export.triton.tensors import ModelWires, Wire, onnx_wires, spec_wire, spec_wires
from usg.graph import Graph, ModelDef, Ref, describe_model
from usg.graph.model import model_output
from usg.ops.signature import signature_of
from usg.specs import Modality, TensorSpec

__all__ = ["BLS", "ENSEMBLE", "ExportPlan", "model_wires", "plan_export"]

ENSEMBLE, BLS = "ensemble", "bls"
TEXT_WIRE = Wire("TYPE_STRING", (1,))


@dataclass(frozen=True)
class ExportPlan:
    """What to write for a graph (see the module docstring for the ensemble rule)."""

    mode: str
    reasons: tuple[str, ...]
    graph_model: str  # the Triton model that serves the graph
    models: dict[str, str]  # USG model -> Triton model (models exported as models of their own)
    in_process: tuple[str, ...]  # USG models run inside the BLS model (no tensor contract to declare)
    io: dict[str, ModelWires]  # tensors of every exported USG model
    fn_models: dict[str, str] = field(default_factory=dict)  # ensemble: fn node -> Triton model
    wires: dict[Ref, Wire] = field(default_factory=dict)  # ensemble: every value crossing between steps


def model_wires(model: ModelDef) -> ModelWires | None:
    """A model's tensors: read from the ONNX file, or from the backend's specs; None when undeclared."""
    if model.backend == "onnxruntime" and model.path is not None:
        return onnx_wires(model.path)
    io = describe_model(model)
    if io is None:
        return None
    ins, outs = spec_wires(io[0]), spec_wires(io[1])
    return None if ins is None or outs is None else (ins, outs)


def real_port(io: ModelWires, port: str) -> str:
    """The model output a node port names (``out`` is the alias of a single-output model)."""
    return model_output(port, io[1])


def _input_wire(graph: Graph, name: str) -> Wire | None:
    d = graph.inputs[name]
    return TEXT_WIRE if d.modality is Modality.TEXT else spec_wire(d.spec)


class _Planner:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.reasons: list[str] = []
        self.io: dict[str, ModelWires] = {}
        self.in_process: list[str] = []
        for name, model in graph.models.items():
            wires = model_wires(model)
            if wires is None:
                self.in_process.append(name)
                self.reasons.append(f"model {name!r} (backend {model.backend}) declares no tensor dtypes/shapes")
            else:
                self.io[name] = wires

    def wire(self, ref: Ref) -> Wire | None:
        g = self.graph
        if ref.is_graph_input:
            return _input_wire(g, ref.port)
        node = g.nodes[ref.source]
        if node.model is not None:
            io = self.io.get(node.model)
            return None if io is None else io[1].get(real_port(io, ref.port))
        sig = signature_of(import_callable(node.fn or ""))
        spec = None if sig is None else sig.outputs.get(ref.port)
        return spec_wire(spec) if isinstance(spec, TensorSpec) else None

    def ensemble_wires(self) -> dict[Ref, Wire]:
        g = self.graph
        for name, d in g.inputs.items():
            if d.optional:
                self.reasons.append(f"input {name!r} is optional (a modality branch Triton ensembles cannot prune)")
            elif _input_wire(g, name) is None:
                self.reasons.append(f"input {name!r} has no dtype and shape")
        wires: dict[Ref, Wire] = {}
        for name in g.inputs:
            input_wire = _input_wire(g, name)
            if input_wire is not None:
                wires[Ref("inputs", name)] = input_wire
        used = [r for n in g.nodes.values() for r in n.inputs.values()] + list(g.outputs.values())
        for node in g.nodes.values():
            if node.map:
                self.reasons.append(f"node {node.name!r} maps over a list (fan-out)")
        for ref in used:
            wire = self.wire(ref)
            if wire is None and not ref.is_graph_input:
                self.reasons.append(f"{ref} is not a tensor with a dtype and shape (a Python value)")
            elif wire is not None:
                wires[ref] = wire
        for oname, ref in g.outputs.items():
            if ref.is_graph_input:
                self.reasons.append(f"output {oname!r} is the graph input {ref.port!r} itself")
            if oname in g.inputs:
                self.reasons.append(f"output {oname!r} has the name of an input (one ensemble tensor name)")
        seen: dict[tuple[str, str], str] = {}
        for oname, ref in g.outputs.items():
            key = (ref.source, self._port_key(ref))
            if key in seen:
                self.reasons.append(f"outputs {seen[key]!r} and {oname!r} are the same value {ref}")
            seen[key] = oname
        return wires

    def _port_key(self, ref: Ref) -> str:
        node = self.graph.nodes.get(ref.source)
        if node is None or node.model is None or node.model not in self.io:
            return ref.port
        return real_port(self.io[node.model], ref.port)


def check_model_name(name: str, what: str) -> None:
    """A Triton model's name is its directory in the repository: one path component, not hidden."""
    bad = [c for c in ("/", "\\", "\0") if c in name] or (["a leading '.'"] if name.startswith(".") else [])
    if not name or bad or any(ord(c) < 32 for c in name) or len(name.encode()) > 255:
        why = f"it holds {bad[0]!r}" if bad and bad[0] in ("/", "\\", "\0") else (bad[0] if bad else "")
        raise UsageError(
            f"{what} {name!r} cannot name a Triton model: the name is its folder in the repository"
            f"{f' ({why})' if why else ''}; fix: rename it to letters, digits, '_', '-' and '.' "
            f"(e.g. {re.sub(r'[^A-Za-z0-9_.-]+', '_', name).strip('._') or 'model'!r})"
        )


def _names(graph: Graph, models: list[str], fn_nodes: list[str]) -> dict[str, str]:
    check_model_name(graph.name, "graph name")
    for model in models:
        check_model_name(model, "model")
    for node in fn_nodes:
        check_model_name(node, "node")
    taken = set(models)
    if graph.name in taken:
        raise UsageError(
            f"the graph is named {graph.name!r}, like one of its models, and both would be Triton models "
            f"of that name; fix: rename the graph (name: {graph.name}-graph) or the model"
        )
    taken.add(graph.name)
    out: dict[str, str] = {}
    for node in fn_nodes:
        name = node if node not in taken else f"{node}_fn"
        if name in taken:
            raise UsageError(
                f"node {node!r} cannot be named {node!r} or {name!r} in the Triton repository (both are "
                "taken by models or the graph); fix: rename the node"
            )
        taken.add(name)
        out[node] = name
    return out


def plan_export(graph: Graph) -> ExportPlan:
    """Choose ensemble or BLS for ``graph`` and name every Triton model (module docstring: the rule)."""
    p = _Planner(graph)
    exported = [m for m in graph.models if m in p.io]
    wires = p.ensemble_wires()
    models = {m: m for m in exported}
    if p.reasons:
        _names(graph, exported, [])
        return ExportPlan(BLS, tuple(dict.fromkeys(p.reasons)), graph.name, models, tuple(p.in_process), p.io)
    fn_nodes = [n for n in graph.order if graph.nodes[n].fn is not None]
    fn_models = _names(graph, exported, fn_nodes)
    return ExportPlan(ENSEMBLE, (), graph.name, models, (), p.io, fn_models, wires)
