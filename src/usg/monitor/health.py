"""A 0–100 deployment health score from a window of requests, with every component and weight shown.

Components (each scored 0–1, 1 = healthy), weighted by the graph's ``monitor.health.weights``;
components that do not apply (no cache configured, too few requests) drop out and the other
weights are renormalised:

- ``latency_jitter``: Shannon entropy (``scipy.stats.entropy``) of successive latency differences,
  relative to the median latency, over fixed bins, normalised to 0–1; score = 1 − entropy.
- ``modality_missing``: how much less often each modality arrives than in the reference profile
  (mean over modalities of max(0, reference presence − live presence)); score = 1 − that.
- ``cache_hit_ratio``: hits / lookups of the node cache in the window (not applicable when the graph has no cache).
- ``error_rate`` / ``rejection_rate``: failed (error, timeout) / refused (429, 413, 400, 503; not
  timeouts, which count as failures) share;
  score = max(0, 1 − 10 × rate) (10 % fails the component).
- ``queue_saturation``: mean of samples of max(in-flight / limit, model queue depth / max_queue);
  score = 1 − that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HealthComponent", "RequestRecord", "health_score", "jitter_entropy"]

_JITTER_EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, np.inf)
_MIN_REQUESTS = 10


@dataclass(frozen=True)
class RequestRecord:
    t: float
    seconds: float
    status: str
    modalities: tuple[str, ...]


@dataclass(frozen=True)
class HealthComponent:
    name: str
    value: float | None  # the measured figure (entropy, rate, ratio); None when not applicable
    score: float | None  # 0..1
    weight: float  # configured weight
    effective_weight: float  # share in the score after dropping components that do not apply
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "score": self.score,
            "weight": self.weight,
            "effective_weight": self.effective_weight,
            "applicable": self.score is not None,
            "detail": self.detail,
        }


def jitter_entropy(latencies: Sequence[float]) -> float:
    """Normalised entropy (0–1) of |Δ latency| / median latency over fixed relative bins."""
    from scipy.stats import entropy

    x = np.asarray(latencies, dtype=np.float64)
    med = float(np.median(x))
    if x.size < 3 or med <= 0:
        return 0.0
    rel = np.abs(np.diff(x)) / med
    counts, _ = np.histogram(rel, bins=np.asarray(_JITTER_EDGES))
    return float(entropy(counts) / np.log(len(counts)))


def _rate_score(rate: float) -> float:
    return max(0.0, 1.0 - 10.0 * rate)


def health_score(
    requests: Sequence[RequestRecord],
    *,
    weights: Mapping[str, float],
    declared_modalities: Sequence[str],
    reference_presence: Mapping[str, float],
    rejected: int,
    saturation: Sequence[float],
    cache: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``cache``: (hits, lookups) when a cache is configured. Returns score, components, counts."""
    n = len(requests)
    parts: list[tuple[str, float | None, float | None, str]] = []
    if n >= _MIN_REQUESTS:
        h = jitter_entropy([r.seconds for r in requests])
        parts.append(("latency_jitter", h, 1.0 - h, f"entropy of latency steps over {n} requests"))
    else:
        parts.append(("latency_jitter", None, None, f"needs {_MIN_REQUESTS} requests, have {n}"))
    if n and declared_modalities:
        gaps = []
        for m in declared_modalities:
            live = sum(1 for r in requests if m in r.modalities) / n
            gaps.append(max(0.0, reference_presence.get(m, 1.0) - live))
        missing = float(np.mean(gaps))
        parts.append(("modality_missing", missing, 1.0 - missing, "presence shortfall against the reference"))
    else:
        parts.append(("modality_missing", None, None, "no requests yet"))
    if cache is None:
        parts.append(("cache_hit_ratio", None, None, "no cache configured (not applicable)"))
    else:
        hits, lookups = cache
        ratio = hits / lookups if lookups else 0.0
        parts.append(("cache_hit_ratio", ratio, ratio if lookups else None, f"{hits}/{lookups} lookups hit"))
    if n:
        errors = sum(1 for r in requests if r.status != "ok")
        parts.append(("error_rate", errors / n, _rate_score(errors / n), f"{errors} of {n} requests failed"))
    else:
        parts.append(("error_rate", None, None, "no requests yet"))
    if n + rejected:
        rate = rejected / (n + rejected)
        parts.append(("rejection_rate", rate, _rate_score(rate), f"{rejected} rejected, {n} served"))
    else:
        parts.append(("rejection_rate", None, None, "no requests yet"))
    if saturation:
        sat = float(np.clip(np.mean(saturation), 0.0, 1.0))
        parts.append(("queue_saturation", sat, 1.0 - sat, f"mean of {len(saturation)} samples"))
    else:
        parts.append(("queue_saturation", None, None, "not sampled yet"))
    total = sum(weights.get(name, 0.0) for name, _, score, _ in parts if score is not None)
    components = [
        HealthComponent(
            name,
            None if value is None else round(value, 6),
            None if score is None else round(score, 6),
            weights.get(name, 0.0),
            round(weights.get(name, 0.0) / total, 6) if score is not None and total > 0 else 0.0,
            detail,
        )
        for name, value, score, detail in parts
    ]
    score = sum((c.score or 0.0) * c.effective_weight for c in components) * 100 if total > 0 else None
    return {
        "score": None if score is None else round(score, 2),
        "components": [c.to_dict() for c in components],
        "requests": n,
        "rejected": rejected,
    }
