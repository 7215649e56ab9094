"""Quantized ONNX models against the execution provider that runs them (ONNX030, ONNX031).

The analysis is :func:`usg.quantize.qdq_check.check_qdq` (shared with ``usg quantize``'s
report); this module turns its rows into findings, one per op type so a transformer with
a hundred wrapped LayerNorms gets one finding that lists the nodes. ONNX030 (CPU EP) runs
for every quantized model; ONNX031 (TensorRT) when ``--target tensorrt=…`` is given.
"""

from __future__ import annotations

from collections.abc import Iterator

from usg.doctor.findings import Finding, Location, RootCause, Severity
from usg.doctor.onnx.checks import OnnxSubject
from usg.doctor.registry import CodeInfo, check, finding
from usg.doctor.runner import CheckContext
from usg.quantize.qdq_check import QdqProblem, check_qdq

__all__ = ["check_quantized"]

C_QDQ_CPU = CodeInfo(
    "ONNX030",
    Severity.WARNING,
    RootCause.UNSUPPORTED_OP,
    "Q/DQ around an op the CPU EP cannot run in INT8",
    "ONNX Runtime fuses DequantizeLinear → op → QuantizeLinear into an integer kernel only for the op types "
    "its QDQ rules cover; any other wrapped op runs in float between the pair: all the rounding error, none "
    "of the speed.",
)
C_QDQ_TRT = CodeInfo(
    "ONNX031",
    Severity.ERROR,
    RootCause.UNSUPPORTED_OP,
    "INT8 op or Q/DQ form TensorRT cannot import",
    "TensorRT's ONNX parser reads explicit quantization only as signed, symmetric QuantizeLinear / "
    "DequantizeLinear; operator-format and contrib integer ops (QLinearConv, MatMulInteger, MatMulNBits …) "
    "and uint8 or asymmetric Q/DQ fail to parse.",
)

_QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger", "MatMulNBits", "QLinearConv")


def _grouped(problems: list[QdqProblem]) -> dict[str, list[QdqProblem]]:
    by_op: dict[str, list[QdqProblem]] = {}
    for p in problems:
        by_op.setdefault(p.op, []).append(p)
    return by_op


@check("onnx", codes=[C_QDQ_CPU, C_QDQ_TRT])
def check_quantized(s: OnnxSubject, ctx: CheckContext) -> Iterator[Finding]:
    if s.model is None or not any(n.op_type.startswith(_QUANT_OPS) for n in s.model.graph.node):
        return
    targets = [("cpu", C_QDQ_CPU)] + ([("tensorrt", C_QDQ_TRT)] if "tensorrt" in ctx.targets else [])
    for target, info in targets:
        for op, rows in _grouped(check_qdq(s.model, target)).items():
            nodes = [r.node for r in rows]
            shown = ", ".join(repr(n) for n in nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
            yield finding(
                info,
                f"{rows[0].problem} ({len(nodes)} node(s): {shown})",
                Location(s.loc, nodes[0]),
                rows[0].fix,
                {"target": target, "op": op, "nodes": nodes},
            )
