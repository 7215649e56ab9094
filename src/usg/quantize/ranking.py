"""Which nodes of a model quantization hurts most: the order the fallback keeps them in FP32.

A local proxy, measured once on the FP32 model: the model runs on a few recorded items with
every float intermediate tensor made an output (ONNX Runtime's
``onnxruntime.quantization.qdq_loss_debug``: ``modify_model_output_intermediate_tensors`` and
``collect_activations``); each quantizable node's float activation inputs are quantized to 8
bits over their observed range, and its weights as the method quantizes them (per channel or per
tensor, 8 or 4 bits). The node's score is the lowest signal-to-quantization-noise ratio (dB) among
them: activations with outliers (a wide range, most values near zero) and weights with a few
large entries score low and go first. Cross-model errors (quantized vs FP32 activations) are not
used: they accumulate along the network and blame late nodes for early noise.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.quantize.methods import ItemsReader, QuantSettings

__all__ = [
    "NodeHarm",
    "activation_sqnr",
    "quantizable_op_types",
    "rank_nodes",
    "rank_op_types",
    "weight_sqnr",
]


@dataclass(frozen=True)
class NodeHarm:
    node: str
    op_type: str
    sqnr_db: float  # lowest SQNR among its quantized inputs (lower: more harmful)
    where: str  # which input set it


def quantizable_op_types(method: str) -> frozenset[str]:
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry

    if method == "static":
        return frozenset(QDQRegistry)
    if method == "dynamic":
        return frozenset(IntegerOpsRegistry)
    return frozenset({"MatMul"})


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    signal = float(np.sum(np.square(ref)))
    noise = float(np.sum(np.square(ref - got)))
    if noise <= 0:
        return float("inf")
    return 10.0 * float(np.log10(max(signal, 1e-30) / noise))


def activation_sqnr(values: Sequence[np.ndarray], bits: int = 8) -> float:
    """SQNR of asymmetric ``bits``-bit quantization over the values' range (zero included)."""
    x = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    if hi == lo:
        return float("inf")
    scale = (hi - lo) / (2**bits - 1)
    deq = np.round((x - lo) / scale) * scale + lo
    return _sqnr(x, deq)


def weight_sqnr(w: np.ndarray, axis: int | None, bits: int = 8) -> float:
    """SQNR of symmetric ``bits``-bit quantization, per channel along ``axis`` (None: per tensor)."""
    w = w.astype(np.float64)
    levels = 2 ** (bits - 1) - 1
    if axis is None:
        amax: Any = np.max(np.abs(w))
    else:
        amax = np.max(np.abs(w), axis=tuple(i for i in range(w.ndim) if i != axis % w.ndim), keepdims=True)
    scale = np.where(amax > 0, amax / levels, 1.0)
    return _sqnr(w, np.round(w / scale) * scale)


def _activations(
    model: Path, items: Sequence[Mapping[str, Any]], inputs: Sequence[str], tmp: Path
) -> dict[str, list[np.ndarray]]:
    from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors

    augmented = tmp / (model.stem + ".augmented.onnx")
    modify_model_output_intermediate_tensors(model, augmented)
    acts = collect_activations(str(augmented), ItemsReader(items, inputs))
    augmented.unlink(missing_ok=True)
    return acts


def _weight_axis(op_type: str, settings: QuantSettings) -> int | None:
    if settings.method == "int4":
        return -1
    if not settings.per_channel or op_type == "Gather":
        return None
    return 0 if op_type in ("Conv", "ConvTranspose") else -1


def rank_nodes(
    fp32: Path, settings: QuantSettings, items: Sequence[Mapping[str, Any]], *, max_items: int = 2
) -> list[NodeHarm]:
    """Quantizable nodes of ``fp32``, most harmful first (see the module docstring)."""
    import onnx
    from onnx import numpy_helper

    from usg.quantize.methods import _input_names

    model = onnx.load(str(fp32))
    inits = {i.name: i for i in model.graph.initializer}
    sample = list(items[:max_items])
    acts: dict[str, list[np.ndarray]] = {}
    if sample:
        with tempfile.TemporaryDirectory(prefix="usg-rank-") as d:
            acts = _activations(fp32, sample, _input_names(fp32), Path(d))
    ops = quantizable_op_types(settings.method) - set(settings.exclude_op_types)
    excluded = set(settings.exclude_nodes)
    bits = 4 if settings.method == "int4" else 8
    out: list[NodeHarm] = []
    for node in model.graph.node:
        if node.op_type not in ops or node.name in excluded or not node.name:
            continue
        scores: list[tuple[float, str]] = []
        for i, name in enumerate(node.input):
            if name in inits:
                w = numpy_helper.to_array(inits[name])
                if w.dtype.kind == "f" and w.ndim >= 2 and i in (0, 1):
                    scores.append((weight_sqnr(w, _weight_axis(node.op_type, settings), bits), f"weight {name}"))
            elif name in acts and settings.method != "int4":
                scores.append((activation_sqnr(acts[name]), f"activation {name}"))
        if scores:
            sqnr, where = min(scores)
            out.append(NodeHarm(node.name, node.op_type, sqnr, where))
    out.sort(key=lambda h: h.sqnr_db)
    return out


def rank_op_types(ranked: Sequence[NodeHarm]) -> list[tuple[str, float]]:
    """Op types by their worst node's SQNR (dB), most harmful first."""
    worst: dict[str, float] = {}
    for h in ranked:
        worst[h.op_type] = min(worst.get(h.op_type, float("inf")), h.sqnr_db)
    return sorted(worst.items(), key=lambda kv: kv[1])
