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
from usg.graph.dump import graph_to_mapping
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


def graph_document(graph: Graph, model_paths: Mapping[str, str]) -> dict[str, Any]:
    """The graph's mapping (:func:`usg.graph.dump.graph_to_mapping`) as the BLS model runs it:
    exported models' paths pointing into the repository, no ``export:`` recipes (the files
    exist), no ``batch:`` policies (Triton batches) and no ``deploy:`` (Triton's instance groups)."""
    doc = graph_to_mapping(graph, model_paths=model_paths)
    for model in doc["models"].values():
        model.pop("export", None)
        model.pop("batch", None)
    doc.pop("deploy", None)
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
