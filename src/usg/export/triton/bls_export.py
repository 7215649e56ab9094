"""Write-side of the BLS graph model: its config and the graph copy it runs (see :mod:`.bls`).

The copy is the graph as YAML with every exported model's ``path`` pointing at the file in the
repository (relative to the copy), no ``export:`` recipes and no ``batch:`` policies (Triton
batches; the executor runs unbatched). Models with no tensor contract (``backend: python``)
keep their settings and run inside the BLS model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from usg.errors import UsageError
from usg.export.triton.configs import Batching, instances_for, make_config
from usg.export.triton.plan import TEXT_WIRE, ExportPlan, real_port
from usg.export.triton.tensors import TritonTensor, Wire, declare, spec_wire
from usg.graph import Graph, Ref
from usg.ops.signature import signature_of
from usg.specs import Modality, TensorSpec

__all__ = ["bls_config", "graph_yaml"]

JSON_WIRE = Wire("TYPE_STRING", (-1,))  # one JSON document (or UTF-8 string) per list element


def _input_wire(graph: Graph, name: str) -> Wire:
    d = graph.inputs[name]
    if d.modality in (Modality.TEXT, Modality.IMAGE):
        return TEXT_WIRE  # text as UTF-8, an image as its encoded file: USG decodes it
    wire = spec_wire(d.spec)
    if wire is None:
        raise UsageError(
            f"graph input {name!r} ({d.modality.value}) has no dtype and shape, which a Triton input needs; "
            f"fix: declare them in the graph (inputs: {{{name}: {{dtype: float32, shape: [N, ...]}}}})"
        )
    return wire


def output_wire(graph: Graph, plan: ExportPlan, ref: Ref) -> Wire:
    """The wire of a graph output: its tensor contract, or JSON documents when it has none."""
    if ref.is_graph_input:
        d = graph.inputs[ref.port]
        if d.modality is Modality.IMAGE:
            return Wire("TYPE_UINT8", (-1, -1, 3))
        return _input_wire(graph, ref.port)
    node = graph.nodes[ref.source]
    if node.map:
        return JSON_WIRE
    if node.model is not None:
        io = plan.io.get(node.model)
        return JSON_WIRE if io is None else io[1][real_port(io, ref.port)]
    from usg.backends.python_fn import import_callable

    sig = signature_of(import_callable(node.fn or ""))
    spec = None if sig is None else sig.outputs.get(ref.port)
    return (spec_wire(spec) if isinstance(spec, TensorSpec) else None) or JSON_WIRE


def bls_config(graph: Graph, plan: ExportPlan, item_axis: Mapping[str, list[str]]) -> Any:
    """The graph's Python model; ``item_axis``: USG model → its tensors declared with the item axis."""
    inputs = [declare(n, _input_wire(graph, n), batched=False, optional=d.optional) for n, d in graph.inputs.items()]
    outputs: list[TritonTensor] = [
        declare(n, output_wire(graph, plan, ref), batched=False) for n, ref in graph.outputs.items()
    ]
    models = {m: {"triton": t, "item_axis": item_axis.get(m, [])} for m, t in plan.models.items()}
    return make_config(
        plan.graph_model,
        backend="python",
        batching=Batching(0),
        inputs=inputs,
        outputs=outputs,
        instances=instances_for(graph.deploy.router),
        parameters={"usg_graph": "graph.yaml", "usg_models": models, "usg_timeout_s": "60"},
    )


def _spec(spec: TensorSpec) -> dict[str, Any]:
    return spec.to_dict()


def graph_document(graph: Graph, model_paths: Mapping[str, str]) -> dict[str, Any]:
    """The graph as the mapping its YAML file would hold, with ``model_paths`` replacing model paths."""
    inputs: dict[str, Any] = {}
    for name, d in graph.inputs.items():
        entry: dict[str, Any] = {"modality": d.modality.value}
        if d.spec is not None:
            entry.update(_spec(d.spec))
        if d.optional:
            entry["optional"] = True
        inputs[name] = entry
    models: dict[str, Any] = {}
    for name, m in graph.models.items():
        model: dict[str, Any] = {"backend": m.backend}
        path = model_paths.get(name) or (str(m.path) if m.path is not None else None)
        if path is not None:
            model["path"] = path
        if m.options:
            model["options"] = dict(m.options)
        if m.input_specs:
            model["inputs"] = {p: _spec(s) for p, s in m.input_specs.items()}
        models[name] = model
    nodes: dict[str, Any] = {}
    for name in graph.order:
        n = graph.nodes[name]
        node: dict[str, Any] = {"model": n.model} if n.model is not None else {"fn": n.fn}
        node["inputs"] = {p: str(r) for p, r in n.inputs.items()}
        if n.map:
            node["map"] = list(n.map)
        if n.options:
            node["options"] = dict(n.options)
        nodes[name] = node
    doc: dict[str, Any] = {"name": graph.name, "inputs": inputs, "models": models, "nodes": nodes}
    doc["outputs"] = {o: str(r) for o, r in graph.outputs.items()}
    if graph.limits:
        doc["limits"] = dict(graph.limits)
    return doc


def graph_yaml(graph: Graph, model_paths: Mapping[str, str]) -> str:
    doc = graph_document(graph, model_paths)
    try:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError as exc:
        raise UsageError(
            f"graph {graph.name!r} holds a value YAML cannot write ({exc}); fix: use plain strings, numbers, "
            "lists and mappings in node and model options"
        ) from None
    head = f"# graph {graph.name!r} as run by its Triton BLS model (written by `usg export triton`)\n"
    return head + text
