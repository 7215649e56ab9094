"""The graph as a Triton ensemble: one step per node, tensors named after the values they carry.

The ensemble does not batch (``max_batch_size: 0``): its tensors have the full shapes USG values
have (a text is ``TYPE_STRING [1]``, a MiniLM embedding ``[1, 384]``), and Triton's ensemble
scheduler turns the leading axis into the batch dim of each batching step model. Tensor names:
a graph input or output keeps its name; any other value is ``NODE.PORT``. Python nodes become
Python-backend models (:class:`usg.export.triton.python_models.FnNodeModel`) of their own.
"""

from __future__ import annotations

from typing import Any

from usg.doctor.triton.config import model_config_pb2
from usg.export.triton.configs import Batching, instances_for, make_config
from usg.export.triton.plan import ExportPlan, real_port
from usg.export.triton.tensors import TritonTensor, declare
from usg.graph import Graph, Ref
from usg.specs import Modality

__all__ = ["ensemble_config", "fn_model_config"]


def _canonical(graph: Graph, plan: ExportPlan, ref: Ref) -> tuple[str, str]:
    if ref.is_graph_input:
        return ("inputs", ref.port)
    node = graph.nodes[ref.source]
    if node.model is not None:
        return (ref.source, real_port(plan.io[node.model], ref.port))
    return (ref.source, ref.port)


class _Names:
    def __init__(self, graph: Graph, plan: ExportPlan) -> None:
        self.graph, self.plan = graph, plan
        self.outputs = {_canonical(graph, plan, ref): name for name, ref in graph.outputs.items()}

    def tensor(self, ref: Ref) -> str:
        key = _canonical(self.graph, self.plan, ref)
        if key in self.outputs:
            return self.outputs[key]
        return key[1] if key[0] == "inputs" else f"{key[0]}.{key[1]}"


def _used_ports(graph: Graph, node: str) -> list[str]:
    refs = [r for n in graph.nodes.values() for r in n.inputs.values()] + list(graph.outputs.values())
    return list(dict.fromkeys(r.port for r in refs if r.source == node))


def fn_model_config(graph: Graph, plan: ExportPlan, node_name: str) -> Any:
    """The Python-backend model of Python node ``node_name`` (full shapes, no batching)."""
    node = graph.nodes[node_name]
    inputs = [declare(port, plan.wires[ref], batched=False) for port, ref in node.inputs.items()]
    outputs = [declare(p, plan.wires[Ref(node_name, p)], batched=False) for p in _used_ports(graph, node_name)]
    text_ports = [
        p for p, r in node.inputs.items() if r.is_graph_input and graph.inputs[r.port].modality is Modality.TEXT
    ]
    return make_config(
        plan.fn_models[node_name],
        backend="python",
        batching=Batching(0),
        inputs=inputs,
        outputs=outputs,
        instances=instances_for(graph.deploy.nodes.get(node_name)),
        parameters={
            "usg_fn": node.fn,
            "usg_options": dict(node.options),
            "usg_text_inputs": text_ports,
            "usg_item_axis": _item_axis([*inputs, *outputs]),
        },
    )


def _item_axis(tensors: list[TritonTensor]) -> list[str]:
    return [t.name for t in tensors if t.item_axis]


def ensemble_config(graph: Graph, plan: ExportPlan) -> Any:
    """The ensemble model: graph inputs/outputs and one scheduling step per node, in graph order."""
    names = _Names(graph, plan)
    inputs = [declare(n, plan.wires[Ref("inputs", n)], batched=False) for n in graph.inputs]
    outputs = [declare(n, plan.wires[ref], batched=False) for n, ref in graph.outputs.items()]
    config = make_config(plan.graph_model, platform="ensemble", inputs=inputs, outputs=outputs)
    pb2 = model_config_pb2()
    for name in graph.order:
        node = graph.nodes[name]
        step = pb2.ModelEnsembling.Step()
        step.model_version = -1
        for port, ref in node.inputs.items():
            step.input_map[port] = names.tensor(ref)
        if node.model is not None:
            step.model_name = plan.models[node.model]
            ports = list(plan.io[node.model][1])
        else:
            step.model_name = plan.fn_models[name]
            ports = _used_ports(graph, name)
        for port in ports:
            step.output_map[port] = names.tensor(Ref(name, port))
        config.ensemble_scheduling.step.append(step)
    return config
