"""Which nodes of a quantized model do the most harm: the order the fallback keeps them in FP32.

Both models (FP32 and quantized) are run on a few recorded items with every float
intermediate tensor made an output (ONNX Runtime's
``onnxruntime.quantization.qdq_loss_debug``: ``modify_model_output_intermediate_tensors`` and
``collect_activations``). A node's harm is the signal-to-quantization-noise ratio (dB) its
output loses against the best of its inputs: a node whose input is still clean but whose
output is noisy is where quantization hurt. Nodes of op types the method does not quantize
are not ranked (excluding them changes nothing).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.quantize.methods import ItemsReader, QuantSettings

__all__ = ["NodeHarm", "quantizable_op_types", "rank_nodes", "rank_op_types"]


@dataclass(frozen=True)
class NodeHarm:
    node: str
    op_type: str
    harm_db: float  # SQNR lost at this node (higher: more harmful)
    sqnr_db: float  # SQNR of its output against FP32


def quantizable_op_types(method: str) -> frozenset[str]:
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry

    if method == "static":
        return frozenset(QDQRegistry)
    if method == "dynamic":
        return frozenset(IntegerOpsRegistry)
    return frozenset({"MatMul"})


def _sqnr(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    signal = sum(float(np.sum(np.square(r.astype(np.float64)))) for r in ref)
    noise = sum(
        float(np.sum(np.square(r.astype(np.float64) - g.astype(np.float64)))) for r, g in zip(ref, got, strict=True)
    )
    if noise <= 0:
        return float("inf")
    if signal <= 0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _activations(
    model: Path, items: Sequence[Mapping[str, Any]], inputs: Sequence[str], tmp: Path
) -> dict[str, list[np.ndarray]]:
    from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors

    augmented = tmp / (model.stem + ".augmented.onnx")
    modify_model_output_intermediate_tensors(model, augmented)
    acts = collect_activations(str(augmented), ItemsReader(items, inputs))
    augmented.unlink(missing_ok=True)
    return acts


def rank_nodes(
    fp32: Path, quantized: Path, settings: QuantSettings, items: Sequence[Mapping[str, Any]], *, max_items: int = 2
) -> list[NodeHarm]:
    """Quantizable nodes of ``fp32``, most harmful first (see the module docstring)."""
    import onnx

    from usg.quantize.methods import _input_names

    model = onnx.load(str(fp32), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    inputs = _input_names(fp32)
    sample = list(items[:max_items])
    with tempfile.TemporaryDirectory(prefix="usg-rank-") as d:
        ref = _activations(fp32, sample, inputs, Path(d))
        got = _activations(quantized, sample, inputs, Path(d))
    ops = quantizable_op_types(settings.method) - set(settings.exclude_op_types)
    excluded = set(settings.exclude_nodes)
    out: list[NodeHarm] = []
    for node in model.graph.node:
        if node.op_type not in ops or node.name in excluded or not node.name:
            continue
        outs = [t for t in node.output if t in ref and t in got and len(ref[t]) == len(got[t])]
        if not outs:
            continue
        sqnr_out = min(_sqnr(ref[t], got[t]) for t in outs)
        ins = [t for t in node.input if t and t not in inits and t in ref and t in got]
        sqnr_in = max((_sqnr(ref[t], got[t]) for t in ins), default=float("inf"))
        harm = (sqnr_in - sqnr_out) if np.isfinite(sqnr_in) else (100.0 - min(sqnr_out, 100.0))
        out.append(NodeHarm(node.name, node.op_type, float(harm), float(sqnr_out)))
    out.sort(key=lambda h: (-h.harm_db, h.sqnr_db))
    return out


def rank_op_types(ranked: Sequence[NodeHarm]) -> list[tuple[str, float]]:
    """Op types by the total harm of their nodes, most harmful first."""
    totals: dict[str, float] = {}
    for h in ranked:
        totals[h.op_type] = totals.get(h.op_type, 0.0) + max(0.0, h.harm_db)
    return sorted(totals.items(), key=lambda kv: -kv[1])
