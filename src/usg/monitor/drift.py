"""Drift of a window (or any second profile) against a reference profile, with scipy's tests.

Test families, each at level ``p_value`` with Bonferroni inside the family (so the chance that a
window without shift raises an alarm is at most ``p_value`` × families):

- **input features** (every numeric feature of every input): two-sample KS
  (``scipy.stats.ks_2samp``) and PSI over the reference's decile bins; categorical features
  (image format) a chi-square test of the 2×k table (``scipy.stats.chi2_contingency``) and PSI over
  categories. A feature drifts when its test is significant **and** PSI ≥ ``psi``.
- **each embedding output**: MMD² with an RBF kernel (median-heuristic bandwidth; up to 100 rows a side), p-value from
  ``scipy.stats.permutation_test``, and KS of the cosine distances to the reference centroid. It
  drifts when either is significant; the centroid's cosine shift is reported (and warned on above
  ``cosine``).
- **each score output**: KS of the values; drifts when significant **and** KL(window ‖ reference)
  over the reference histogram (``scipy.stats.entropy``) ≥ ``kl``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from usg.errors import MissingDependency, UsageError
from usg.monitor.config import Thresholds
from usg.monitor.sketch import cosine_distances

__all__ = ["compare_profiles", "mmd_test", "psi", "require_scipy"]

_MIN_SAMPLES = 8
_MMD_ROWS = 100  # rows per side in the MMD test (its cost grows with the square of the rows)
_SMOOTH = 0.5


def require_scipy(purpose: str) -> None:
    """Raise MissingDependency with the pip line when scipy (the ``monitor`` extra) is missing."""
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise MissingDependency("scipy", "monitor", purpose) from None


def _proportions(counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    c = counts.astype(np.float64) + _SMOOTH
    return np.asarray(c / c.sum())


def psi(reference: np.ndarray[Any, Any], current: np.ndarray[Any, Any], bins: int = 10) -> float:
    """Population stability index over the reference's quantile bins (symmetric KL of the bin shares)."""
    from scipy.special import rel_entr

    edges = np.unique(np.quantile(reference, np.linspace(0, 1, bins + 1)[1:-1]))
    ref_c = np.bincount(np.searchsorted(edges, reference, side="right"), minlength=len(edges) + 1)
    cur_c = np.bincount(np.searchsorted(edges, current, side="right"), minlength=len(edges) + 1)
    p, q = _proportions(cur_c), _proportions(ref_c)
    return float(np.sum(rel_entr(p, q) + rel_entr(q, p)))


def mmd_test(
    x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], *, permutations: int = 999, seed: int = 0
) -> tuple[float, float]:
    """MMD² (RBF kernel, median-heuristic bandwidth) of two row sets and its permutation p-value."""
    from scipy.stats import permutation_test

    pooled = np.concatenate([x, y]).astype(np.float32)
    norms = np.einsum("ij,ij->i", pooled, pooled)
    sq = np.maximum(norms[:, None] + norms[None, :] - 2.0 * (pooled @ pooled.T), 0.0)
    med = float(np.median(sq[np.triu_indices(len(pooled), k=1)]))
    kernel = np.exp(-sq / (med if med > 0 else 1.0)).astype(np.float32)
    colsum = kernel.sum(axis=0)
    total = float(colsum.sum())
    n = len(x)

    def statistic(ix: np.ndarray[Any, Any], iy: np.ndarray[Any, Any], axis: int = -1) -> np.ndarray[Any, Any]:
        # ix / iy hold row indices into `pooled`, one resample per leading row; with a = 1 on x rows,
        # sum Kxx = a K a, sum Kxy = a K (1 - a), sum Kyy = total - 2 sum Kxy - sum Kxx
        ix2 = np.atleast_2d(ix).astype(np.int64)
        nx, ny = ix2.shape[1], len(pooled) - ix2.shape[1]
        a = np.zeros((ix2.shape[0], len(pooled)), dtype=np.float32)
        np.put_along_axis(a, ix2, 1.0, axis=1)
        ka = a @ kernel
        sxx = np.einsum("ij,ij->i", ka, a, dtype=np.float64)
        sxy = a.astype(np.float64) @ colsum - sxx
        syy = total - 2.0 * sxy - sxx
        out = sxx / nx**2 + syy / ny**2 - 2.0 * sxy / (nx * ny)
        return out if np.ndim(ix) > 1 else out[0]

    res = permutation_test(
        (np.arange(n, dtype=np.float64), np.arange(n, len(pooled), dtype=np.float64)),
        statistic,
        permutation_type="independent",
        vectorized=True,
        n_resamples=permutations,
        alternative="greater",
        rng=np.random.default_rng(seed),
        batch=max(1, min(permutations, 2_000_000 // len(pooled))),
    )
    return float(res.statistic), float(res.pvalue)


def _sample(section: Mapping[str, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(section.get("sample", []), dtype=np.float64)


def _feature_tests(ref: Mapping[str, Any], cur: Mapping[str, Any]) -> list[dict[str, Any]]:
    from scipy.stats import chi2_contingency, ks_2samp

    tests: list[dict[str, Any]] = []
    for name, rin in ref.get("inputs", {}).items():
        cin = cur.get("inputs", {}).get(name)
        if not cin:
            continue
        for feat, rs in rin.get("numeric", {}).items():
            a, b = _sample(rs), _sample(cin.get("numeric", {}).get(feat, {}))
            if a.size < _MIN_SAMPLES or b.size < _MIN_SAMPLES:
                continue
            ks = ks_2samp(a, b)
            tests.append(
                {
                    "input": name,
                    "feature": feat,
                    "test": "ks",
                    "statistic": float(ks.statistic),
                    "p_value": float(ks.pvalue),
                    "psi": psi(a, b),
                    "reference_mean": rs.get("mean"),
                    "window_mean": cin["numeric"][feat].get("mean"),
                }
            )
        for feat, rcounts in rin.get("categorical", {}).items():
            ccounts = cin.get("categorical", {}).get(feat, {})
            cats = sorted(set(rcounts) | set(ccounts))
            table = np.array([[rcounts.get(c, 0) for c in cats], [ccounts.get(c, 0) for c in cats]], dtype=np.float64)
            if table[1].sum() < _MIN_SAMPLES:
                continue
            p = 1.0 if len(cats) < 2 else float(chi2_contingency(table + _SMOOTH).pvalue)
            p_cur, p_ref = _proportions(table[1]), _proportions(table[0])
            from scipy.special import rel_entr

            tests.append(
                {
                    "input": name,
                    "feature": feat,
                    "test": "chi2",
                    "p_value": p,
                    "psi": float(np.sum(rel_entr(p_cur, p_ref) + rel_entr(p_ref, p_cur))),
                    "reference": rcounts,
                    "window": ccounts,
                }
            )
    return tests


def _rows(x: np.ndarray[Any, Any], seed: int = 0) -> np.ndarray[Any, Any]:
    if len(x) <= _MMD_ROWS:
        return x
    return x[np.sort(np.random.default_rng(seed).choice(len(x), _MMD_ROWS, replace=False))]


def _embedding_tests(name: str, ref: Mapping[str, Any], cur: Mapping[str, Any], th: Thresholds) -> dict[str, Any]:
    from scipy.stats import ks_2samp

    x = np.asarray(ref.get("sample", []), dtype=np.float64)
    y = np.asarray(cur.get("sample", []), dtype=np.float64)
    if len(x) < _MIN_SAMPLES or len(y) < _MIN_SAMPLES or x.shape[1] != y.shape[1]:
        return {"output": name, "kind": "embedding", "skipped": "too few rows, or dimensions differ"}
    rc, cc = np.asarray(ref["centroid"], dtype=np.float64), np.asarray(cur["centroid"], dtype=np.float64)
    denom = float(np.linalg.norm(rc) * np.linalg.norm(cc))
    shift = 1.0 - float(rc @ cc) / denom if denom > 0 else 0.0
    mmd2, mmd_p = mmd_test(_rows(x), _rows(y), permutations=th.permutations)
    ks = ks_2samp(_sample(ref.get("distance", {})), cosine_distances(y, rc))
    return {
        "output": name,
        "kind": "embedding",
        "centroid_cosine_shift": shift,
        "mmd2": mmd2,
        "mmd_p_value": mmd_p,
        "distance_ks": float(ks.statistic),
        "distance_p_value": float(ks.pvalue),
    }


def _score_tests(name: str, ref: Mapping[str, Any], cur: Mapping[str, Any]) -> dict[str, Any]:
    from scipy.stats import entropy, ks_2samp

    a, b = _sample(ref.get("values", {})), _sample(cur.get("values", {}))
    if a.size < _MIN_SAMPLES or b.size < _MIN_SAMPLES:
        return {"output": name, "kind": "score", "skipped": "too few values"}
    edges = np.asarray(ref["histogram"]["edges"])
    counts, _ = np.histogram(np.clip(b, edges[0], edges[-1]), bins=edges)
    kl = float(entropy(_proportions(counts), _proportions(np.asarray(ref["histogram"]["counts"]))))
    ks = ks_2samp(a, b)
    return {"output": name, "kind": "score", "kl": kl, "ks": float(ks.statistic), "p_value": float(ks.pvalue)}


def compare_profiles(
    reference: Mapping[str, Any], current: Mapping[str, Any], thresholds: Thresholds
) -> dict[str, Any]:
    """Every test of ``current`` against ``reference`` (both profile bodies), flags and a verdict."""
    require_scipy("drift tests")
    if not reference.get("inputs") and not reference.get("outputs"):
        raise UsageError("the reference profile has no inputs or outputs; fix: build it with `usg profile`")
    alpha = thresholds.p_value
    features = _feature_tests(reference, current)
    for t in features:
        t["alpha"] = alpha / max(1, len(features))
        t["drift"] = bool(t["p_value"] < t["alpha"] and t["psi"] >= thresholds.psi)
    outputs: list[dict[str, Any]] = []
    for name, ref in reference.get("outputs", {}).items():
        cur = current.get("outputs", {}).get(name)
        if not cur or not cur.get("count") or not ref.get("count"):
            continue
        if ref["kind"] == "embedding":
            t = _embedding_tests(name, ref, cur, thresholds)
            if "skipped" not in t:
                t["alpha"] = alpha / 2
                t["drift"] = bool(min(t["mmd_p_value"], t["distance_p_value"]) < t["alpha"])
                t["centroid_warning"] = bool(t["centroid_cosine_shift"] >= thresholds.cosine)
        else:
            t = _score_tests(name, ref, cur)
            if "skipped" not in t:
                t["alpha"] = alpha
                t["drift"] = bool(t["p_value"] < alpha and t["kl"] >= thresholds.kl)
        outputs.append(t)
    drifted = [f"{t['input']}.{t['feature']}" for t in features if t["drift"]]
    drifted += [t["output"] for t in outputs if t.get("drift")]
    return {
        "drift": bool(drifted),
        "drifted": drifted,
        "families": 1 + len(outputs) if features else len(outputs),
        "features": features,
        "outputs": outputs,
        "thresholds": thresholds.to_dict(),
        "reference_count": reference.get("count", 0),
        "window_count": current.get("count", 0),
    }
