"""Which nodes of a model quantization hurts most: the order the fallback keeps them in FP32.

A local proxy, measured once on the FP32 model: the model runs on a few recorded items with
every float intermediate tensor made an output (ONNX Runtime's
``onnxruntime.quantization.qdq_loss_debug``: ``modify_model_output_intermediate_tensors`` and
``collect_activations``); each quantizable node's float activation inputs (and, for static QDQ,
its outputs) are quantized to 8 bits over their observed range, and its weights as the method
quantizes them (per channel or per tensor, 8 or 4 bits). The node's score is the lowest signal-
to-quantization-noise ratio (dB) of any channel among them: activations with outliers (a wide
range, most values near zero) and weights with a few large entries score low and go first.
Cross-model errors (quantized vs FP32 activations) are not used: they accumulate along the
network and blame late nodes for early noise.
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


def _worst_channel_sqnr(ref: np.ndarray, deq: np.ndarray, axis: int) -> float:
    """The lowest per-channel SQNR: a tensor-wide ratio hides channels an outlier drowned."""
    if ref.ndim < 2:
        return _sqnr(ref, deq)
    axis %= ref.ndim
    ref_c, deq_c = (
        np.moveaxis(ref, axis, 0).reshape(ref.shape[axis], -1),
        np.moveaxis(deq, axis, 0).reshape(ref.shape[axis], -1),
    )
    signal = np.sum(np.square(ref_c), axis=1)
    noise = np.sum(np.square(ref_c - deq_c), axis=1)
    live = signal > 0
    if not live.any():
        return float("inf")
    with np.errstate(divide="ignore"):
        ratios = np.where(noise[live] > 0, signal[live] / np.maximum(noise[live], 1e-300), np.inf)
    return 10.0 * float(np.log10(np.min(ratios)))


def activation_sqnr(values: Sequence[np.ndarray], bits: int = 8) -> float:
    """Worst-channel SQNR of asymmetric ``bits``-bit per-tensor quantization over the values'
    range (zero included); channels are axis 1 of 4-D (NCHW) tensors, the last axis otherwise."""
    arrays = [np.asarray(v, dtype=np.float64) for v in values if np.size(v)]
    if not arrays:
        return float("inf")
    lo = min(0.0, min(float(a.min()) for a in arrays))
    hi = max(0.0, max(float(a.max()) for a in arrays))
    if hi == lo:
        return float("inf")
    scale = (hi - lo) / (2**bits - 1)
    worst = float("inf")
    for a in arrays:
        deq = np.round((a - lo) / scale) * scale + lo
        worst = min(worst, _worst_channel_sqnr(a, deq, 1 if a.ndim == 4 else -1))
    return worst


def weight_sqnr(w: np.ndarray, axis: int | None, bits: int = 8, channel_axis: int = -1) -> float:
    """Worst-channel SQNR (channels along ``channel_axis``) of symmetric ``bits``-bit quantization
    with one scale per channel along ``axis``, or one for the tensor (``axis`` None)."""
    w = w.astype(np.float64)
    if w.size == 0:
        return float("inf")
    levels = 2 ** (bits - 1) - 1
    if axis is None:
        amax: Any = np.max(np.abs(w))
    else:
        amax = np.max(np.abs(w), axis=tuple(i for i in range(w.ndim) if i != axis % w.ndim), keepdims=True)
    scale = np.where(amax > 0, amax / levels, 1.0)
    return _worst_channel_sqnr(w, np.round(w / scale) * scale, channel_axis)


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
                    channel = 0 if node.op_type in ("Conv", "Gather") else -1
                    sqnr = weight_sqnr(w, _weight_axis(node.op_type, settings), bits, channel)
                    scores.append((sqnr, f"weight {name}"))
            elif name in acts and settings.method != "int4":
                scores.append((activation_sqnr(acts[name]), f"activation {name}"))
        if settings.method == "static":  # static QDQ also quantizes what the node produces
            for name in node.output:
                if name in acts:
                    scores.append((activation_sqnr(acts[name]), f"output {name}"))
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
