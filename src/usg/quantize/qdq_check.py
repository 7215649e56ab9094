"""Check a quantized ONNX model against the execution provider that will run it (pure function).

Two problems, both silent at run time:

- **QDQ around an op the EP cannot run in INT8.** ONNX Runtime fuses ``DequantizeLinear → op →
  QuantizeLinear`` into an integer kernel only for the op types its QDQ rules cover; any other op
  wrapped in Q/DQ runs in float between a dequantize and a quantize — all the rounding error, none
  of the speed. (ORT's default static op list wraps ``LayerNormalization``, which the CPU EP has
  no INT8 kernel for.) The CUDA EP has no INT8 kernels for QDQ at all.
- **INT8 ops TensorRT cannot import.** TensorRT's ONNX parser reads explicit quantization only as
  ``QuantizeLinear`` / ``DequantizeLinear`` with signed INT8 (or INT4/FP8) and a zero point of 0
  (symmetric); ONNX Runtime's operator-format and contrib integer ops (``QLinearConv``,
  ``MatMulInteger``, ``DynamicQuantizeLinear``, ``MatMulNBits`` …) and uint8/asymmetric Q/DQ
  fail to parse.

:func:`check_qdq` returns :class:`QdqProblem` rows (op, node, problem, fix); the doctor turns
them into findings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CPU_INT8_OPS", "TARGETS", "TENSORRT_UNSUPPORTED_OPS", "QdqProblem", "check_qdq"]

# ops ORT's CPU EP runs on int8 when wrapped in Q/DQ (its QDQ selector/action rules): fused into a
# QLinear* / integer kernel, or Q/DQ dropped around pure data movement, or folded into Q (Relu, Clip)
CPU_INT8_OPS = frozenset(
    {
        "Add", "ArgMax", "AveragePool", "Clip", "Concat", "Conv", "ConvTranspose", "DepthToSpace", "Expand",
        "Flatten", "Gather", "GatherElements", "Gemm", "GlobalAveragePool", "LeakyRelu", "MatMul", "MaxPool",
        "Mul", "Pad", "Relu", "Reshape", "Resize", "Sigmoid", "Slice", "Softmax", "SpaceToDepth", "Split",
        "Squeeze", "Tile", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip
# data movement: no arithmetic, so Q/DQ around it is harmless on any EP
_DATA_MOVEMENT = frozenset(
    {"DepthToSpace", "Expand", "Flatten", "Gather", "GatherElements", "Reshape", "Slice", "SpaceToDepth",
     "Split", "Squeeze", "Tile", "Transpose", "Unsqueeze", "Concat", "MaxPool", "Pad", "Resize", "Where"}
)  # fmt: skip
TENSORRT_UNSUPPORTED_OPS = frozenset(
    {
        "ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulInteger", "MatMulIntegerToFloat",
        "MatMulNBits", "QAttention", "QEmbedLayerNormalization", "QGemm", "QLinearAdd", "QLinearAveragePool",
        "QLinearConcat", "QLinearConv", "QLinearGlobalAveragePool", "QLinearLeakyRelu", "QLinearMatMul",
        "QLinearMul", "QLinearSigmoid", "QLinearSoftmax", "QLinearWhere", "DynamicQuantizeLSTM",
    }
)  # fmt: skip
TARGETS = ("cpu", "cuda", "tensorrt")
_Q, _DQ = "QuantizeLinear", "DequantizeLinear"
_TRT_QDQ_TYPES = {3, 22, 17, 18}  # INT8, INT4, FLOAT8E4M3FN, FLOAT8E4M3FNUZ (TensorProto enum)


@dataclass(frozen=True)
class QdqProblem:
    """One problem: which op and node, what is wrong for which target, and the fix."""

    target: str
    op: str
    node: str
    problem: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"target": self.target, "op": self.op, "node": self.node, "problem": self.problem, "fix": self.fix}


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, str | Path):
        return onnx.load(str(model), load_external_data=False)
    return model


def _wrapped(graph: Any) -> Iterable[tuple[Any, bool, bool]]:
    """(node, has a DQ input, has a Q output) for every node that is not itself Q/DQ."""
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for n in graph.node:
        if n.op_type in (_Q, _DQ):
            continue
        dq_in = any(i in producer and producer[i].op_type == _DQ for i in n.input)
        q_out = any(c.op_type == _Q for o in n.output for c in consumers.get(o, []))
        yield n, dq_in, q_out


def _zero_point(graph: Any, name: str) -> tuple[int | None, bool]:
    """(TensorProto data type, all zeros) of a Q/DQ zero-point initializer; (None, True) when absent."""
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return init.data_type, bool(np.all(numpy_helper.to_array(init) == 0))
    return None, True


def _tensorrt(graph: Any) -> list[QdqProblem]:
    out: list[QdqProblem] = []
    seen: set[str] = set()
    for n in graph.node:
        if n.op_type in TENSORRT_UNSUPPORTED_OPS:
            out.append(
                QdqProblem(
                    "tensorrt",
                    n.op_type,
                    n.name,
                    f"{n.op_type} is an ONNX Runtime integer op; TensorRT's ONNX parser imports INT8 only as "
                    "QuantizeLinear/DequantizeLinear",
                    "re-quantize for TensorRT with `usg quantize --method static` (QDQ format) and symmetric int8 "
                    "activations, or keep this model on the CPU/CUDA EP",
                )
            )
        elif n.op_type in (_Q, _DQ) and len(n.input) > 2 and n.input[2]:
            dtype, zeros = _zero_point(graph, n.input[2])
            key = f"{dtype}:{zeros}:{n.op_type}"
            if dtype is not None and (dtype not in _TRT_QDQ_TYPES or not zeros) and key not in seen:
                seen.add(key)  # one row per kind: a QDQ model has hundreds of identical pairs
                what = "uint8" if dtype == 2 else f"type {dtype}"
                out.append(
                    QdqProblem(
                        "tensorrt",
                        n.op_type,
                        n.name,
                        f"{n.op_type} with a {what if dtype not in _TRT_QDQ_TYPES else 'int8'} zero point"
                        f"{'' if zeros else ' that is not 0'}: TensorRT supports only symmetric signed INT8 Q/DQ "
                        "(and the same for every Q/DQ like it in this model)",
                        "quantize with activation_type=QInt8, weight_type=QInt8 and "
                        "extra_options={'ActivationSymmetric': True, 'WeightSymmetric': True}",
                    )
                )
    return out


def check_qdq(model: Any, target: str = "cpu") -> list[QdqProblem]:
    """Problems of a quantized model (path or ``onnx.ModelProto``) for ``target`` (cpu, cuda, tensorrt)."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: unknown; use one of {', '.join(TARGETS)}")
    graph = _load(model).graph
    out: list[QdqProblem] = []
    if target == "tensorrt":
        return _tensorrt(graph)
    supported = CPU_INT8_OPS if target == "cpu" else _DATA_MOVEMENT
    for n, dq_in, q_out in _wrapped(graph):
        if not (dq_in and q_out) or n.op_type in supported:
            continue
        if target == "cpu":
            problem = (
                f"{n.op_type} sits between DequantizeLinear and QuantizeLinear, but the CPU EP has no INT8 kernel "
                "for it: it runs in float, and the Q/DQ pair only adds rounding error and work"
            )
        else:
            problem = (
                f"{n.op_type} is wrapped in Q/DQ, but the CUDA EP runs QDQ models in float (DequantizeLinear → "
                f"{n.op_type} → QuantizeLinear): no speed-up, only rounding error"
            )
        fix = (
            f"keep it in FP32: `usg quantize` with op types excluding {n.op_type} "
            f"(op_types_to_quantize without it, or nodes_to_exclude=[{n.name!r}])"
            if target == "cpu"
            else "run INT8 models on the TensorRT EP (check with target tensorrt), or serve the FP32 model on CUDA"
        )
        out.append(QdqProblem(target, n.op_type, n.name, problem, fix))
    return out
