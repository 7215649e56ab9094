"""usg.quantize: INT8 / INT4 models chosen by an accuracy guard on the graph's end outputs.

``quantize_graph(graph, samples, QuantizeConfig(...), out_dir)`` calibrates each selected model
on the tensors it receives when the graph runs on ``samples`` (ONNX Runtime's own quantizers do
the work), guards the end outputs against the FP32 graph on held-out samples, keeps the most
harmful nodes in FP32 until the guard holds, and returns a :class:`QuantizeResult`;
``write_quant_sidecar`` writes ``GRAPH.quant.yaml``, which ``usg run / serve / bench`` apply.
``check_qdq(model, target)`` reports Q/DQ an execution provider cannot run in INT8.
"""

from __future__ import annotations

from usg.quantize.guard import Guard, GuardResult, evaluate, parse_guard
from usg.quantize.methods import QuantSettings, quantize_model
from usg.quantize.qdq_check import QdqProblem, check_qdq
from usg.quantize.report import result_json, write_html, write_quant_sidecar
from usg.quantize.runner import ModelOutcome, QuantizeConfig, QuantizeResult, measure_speed, quantize_graph

__all__ = [
    "Guard",
    "GuardResult",
    "ModelOutcome",
    "QdqProblem",
    "QuantSettings",
    "QuantizeConfig",
    "QuantizeResult",
    "check_qdq",
    "evaluate",
    "measure_speed",
    "parse_guard",
    "quantize_graph",
    "quantize_model",
    "result_json",
    "write_html",
    "write_quant_sidecar",
]
