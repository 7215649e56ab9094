"""Summaries of a set of observations: the body of a reference profile and of a live window.

An :class:`Observation` is one request's input features (per input name) and the rows of each
watched output. :func:`summarize` turns a list of them into plain JSON data: per numeric feature
moments, quantiles and a deterministic sample (for KS / PSI), per categorical feature counts, per
embedding output the centroid, distances to it and a sample of rows (for MMD), per score output a
histogram and a sample of values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.monitor.config import OutputWatch
from usg.monitor.features import CATEGORICAL

__all__ = ["EMBEDDING_SAMPLE", "Observation", "as_rows", "cosine_distances", "numeric_summary", "summarize"]

EMBEDDING_SAMPLE = 200
_QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


@dataclass
class Observation:
    t: float
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)


def _r(x: float) -> float:
    return float(f"{float(x):.7g}")


def _vec(x: np.ndarray[Any, Any], raw: bool) -> Any:
    """A sample array as JSON data (rounded lists), or as is for in-process use (``raw``)."""
    if raw:
        return x
    return np.round(np.asarray(x, dtype=np.float64), 6).tolist()


def _pick(n: int, cap: int, seed: int) -> np.ndarray[Any, Any]:
    """Indices of a deterministic subsample of ``cap`` out of ``n`` (all when n <= cap), in order."""
    if n <= cap:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


def numeric_summary(
    values: Sequence[float] | np.ndarray[Any, Any], cap: int, seed: int = 0, raw: bool = False
) -> dict[str, Any]:
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return {"n": 0, "sample": []}
    return {
        "n": int(x.size),
        "mean": _r(x.mean()),
        "std": _r(x.std()),
        "min": _r(x.min()),
        "max": _r(x.max()),
        "quantiles": {f"p{round(q * 100)}": _r(v) for q, v in zip(_QUANTILES, np.quantile(x, _QUANTILES), strict=True)},
        "sample": _vec(x[_pick(x.size, cap, seed)], raw),
    }


def as_rows(value: Any) -> np.ndarray[Any, Any] | None:
    """An output value → a 2-D float array of rows (one embedding or score vector per row), or None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        parts = [r for r in (as_rows(v) for v in value) if r is not None and r.size]
        if not parts or len({p.shape[1] for p in parts}) != 1:
            return None
        return np.concatenate(parts, axis=0)
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiub" or arr.size == 0:
        return None
    arr = arr.astype(np.float32, copy=False)
    if arr.ndim == 0:
        return arr.reshape(1, 1)
    if arr.ndim == 1:
        return arr.reshape(1, -1)
    return arr.reshape(-1, arr.shape[-1])


def cosine_distances(rows: np.ndarray[Any, Any], centroid: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    from scipy.spatial.distance import cdist

    return np.asarray(cdist(rows.astype(np.float64), centroid.reshape(1, -1).astype(np.float64), "cosine")[:, 0])


def _embedding(rows: np.ndarray[Any, Any], watch: OutputWatch, cap: int, seed: int, raw: bool) -> dict[str, Any]:
    centroid = rows.mean(axis=0)
    dist = cosine_distances(rows, centroid) if np.linalg.norm(centroid) > 0 else np.zeros(len(rows))
    pick = _pick(len(rows), EMBEDDING_SAMPLE, seed)
    return {
        "kind": "embedding",
        "ref": str(watch.ref),
        "count": len(rows),
        "dim": int(rows.shape[1]),
        "centroid": _vec(centroid, raw),
        "distance": numeric_summary(dist, cap, seed, raw),
        "sample": _vec(rows[pick], raw),
    }


def _score(values: np.ndarray[Any, Any], watch: OutputWatch, cap: int, seed: int, raw: bool) -> dict[str, Any]:
    lo, hi = watch.range if watch.range is not None else (float(values.min()), float(values.max()))
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, watch.bins + 1)
    counts, _ = np.histogram(np.clip(values, lo, hi), bins=edges)
    return {
        "kind": "score",
        "ref": str(watch.ref),
        "count": int(values.size),
        "histogram": {"edges": [_r(e) for e in edges], "counts": [int(c) for c in counts]},
        "values": numeric_summary(values, cap, seed, raw),
    }


def summarize(
    observations: Sequence[Observation],
    inputs: Mapping[str, str],
    watches: Sequence[OutputWatch],
    *,
    cap: int = 1000,
    seed: int = 0,
    raw: bool = False,
) -> dict[str, Any]:
    """``inputs``: input name → modality. Returns ``{count, presence, inputs, outputs}``; ``raw`` keeps
    samples as numpy arrays (for comparing in-process) instead of rounded JSON lists."""
    n = len(observations)
    body: dict[str, Any] = {"count": n, "presence": {}, "inputs": {}, "outputs": {}}
    for name, modality in inputs.items():
        seen = [o.features[name] for o in observations if name in o.features]
        body["presence"][name] = _r(len(seen) / n) if n else 0.0
        numeric: dict[str, list[float]] = {}
        categorical: dict[str, dict[str, int]] = {}
        for feats in seen:
            for key, value in feats.items():
                if key in CATEGORICAL:
                    bucket = categorical.setdefault(key, {})
                    bucket[str(value)] = bucket.get(str(value), 0) + 1
                else:
                    numeric.setdefault(key, []).append(float(value))
        body["inputs"][name] = {
            "modality": modality,
            "count": len(seen),
            "numeric": {k: numeric_summary(v, cap, seed, raw) for k, v in sorted(numeric.items())},
            "categorical": {k: dict(sorted(v.items())) for k, v in sorted(categorical.items())},
        }
    for watch in watches:
        parts = [o.outputs[watch.name] for o in observations if watch.name in o.outputs]
        dims = {p.shape[1] for p in parts}
        if not parts or len(dims) != 1:
            body["outputs"][watch.name] = {"kind": watch.kind, "ref": str(watch.ref), "count": 0}
            continue
        rows = np.concatenate(parts, axis=0)
        if watch.kind == "embedding":
            body["outputs"][watch.name] = _embedding(rows, watch, cap, seed, raw)
        else:
            body["outputs"][watch.name] = _score(rows.reshape(-1), watch, cap, seed, raw)
    return body
