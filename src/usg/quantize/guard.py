"""The accuracy guard: the quantized graph's end outputs against the FP32 graph's.

Metrics per output type (the type is read from the FP32 values):

- **text** (``lines``: a list of ``{"text": ...}`` dicts, or a string): ``char_accuracy``
  (1 − Levenshtein distance / reference characters, over all held-out documents) and
  ``exact_line_rate`` (share of FP32 lines read identically);
- **embedding** (a float array whose rows have unit L2 norm): ``cosine`` (mean over rows)
  and ``min_cosine``;
- **tensor** (any other array): ``max_abs`` and ``max_rel`` (max |Δ| / max |FP32|).

A guard is ``OUTPUT:METRIC>=X`` (or ``<=`` for errors). Without ``--guard`` every output gets
its type's default: text ``char_accuracy>=0.99``, embedding ``cosine>=0.99``, tensor
``max_rel<=0.05``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from usg.errors import UsageError

__all__ = [
    "DEFAULT_GUARDS",
    "Guard",
    "GuardResult",
    "char_accuracy",
    "evaluate",
    "levenshtein",
    "output_kind",
    "parse_guard",
]

METRICS = {
    "text": ("char_accuracy", "exact_line_rate"),
    "embedding": ("cosine", "min_cosine"),
    "tensor": ("max_abs", "max_rel"),
}
DEFAULT_GUARDS = {
    "text": ("char_accuracy", ">=", 0.99),
    "embedding": ("cosine", ">=", 0.99),
    "tensor": ("max_rel", "<=", 0.05),
}


@dataclass(frozen=True)
class Guard:
    output: str
    metric: str
    op: str  # ">=" or "<="
    threshold: float

    def holds(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    def shortfall(self, value: float) -> float:
        """How far the value is on the wrong side of the threshold (0 when it holds)."""
        return max(0.0, self.threshold - value) if self.op == ">=" else max(0.0, value - self.threshold)

    def __str__(self) -> str:
        return f"{self.output}:{self.metric}{self.op}{self.threshold:g}"


_GUARD_RE = re.compile(r"^\s*([\w.-]+)\s*:\s*(\w+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")


def parse_guard(text: str) -> Guard:
    m = _GUARD_RE.match(text)
    if m is None:
        raise UsageError(
            f"--guard {text!r}: not OUTPUT:METRIC>=X; fix: e.g. --guard lines:char_accuracy>=0.99 "
            "or --guard text_embedding:cosine>=0.995"
        )
    output, metric, op, value = m.groups()
    known = {name for names in METRICS.values() for name in names}
    if metric not in known:
        raise UsageError(f"--guard {text!r}: unknown metric {metric!r}; fix: use one of {', '.join(sorted(known))}")
    try:
        threshold = float(value)
    except ValueError:
        raise UsageError(f"--guard {text!r}: {value!r} is not a number; fix: e.g. >=0.99") from None
    return Guard(output, metric, op, threshold)


def output_kind(value: Any) -> str | None:
    """``text``, ``embedding``, ``tensor``, or None for values the guard cannot compare."""
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, dict) and "text" in v for v in value)):
        return "text"
    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
        rows = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
        norms = np.linalg.norm(rows.astype(np.float64), axis=1)
        return "embedding" if np.allclose(norms, 1.0, atol=1e-3) else "tensor"
    if isinstance(value, np.ndarray) and value.size:
        return "tensor"
    return None


def _lines(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.split("\n")
    return [str(v["text"]) for v in value]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """1 − total edit distance / total reference characters (1.0 when there is nothing to read)."""
    total = sum(len(r) for r in references)
    if total == 0:
        return 1.0 if not any(hypotheses) else 0.0
    dist = sum(levenshtein(r, h) for r, h in zip(references, hypotheses, strict=True))
    return max(0.0, 1.0 - dist / total)


def _text_metrics(ref: Sequence[Any], hyp: Sequence[Any]) -> dict[str, float]:
    ref_docs = [_lines(v) for v in ref]
    hyp_docs = [_lines(v) for v in hyp]
    acc = char_accuracy(["\n".join(r) for r in ref_docs], ["\n".join(h) for h in hyp_docs])
    n_lines = sum(len(r) for r in ref_docs)
    same = 0
    for r, h in zip(ref_docs, hyp_docs, strict=True):
        pool = list(h)
        for line in r:
            if line in pool:
                pool.remove(line)
                same += 1
    return {"char_accuracy": acc, "exact_line_rate": same / n_lines if n_lines else 1.0}


def _embedding_metrics(ref: Sequence[Any], hyp: Sequence[Any]) -> dict[str, float]:
    cosines: list[float] = []
    for r, h in zip(ref, hyp, strict=True):
        rr = np.asarray(r, dtype=np.float64).reshape(np.shape(r)[0], -1)
        if not isinstance(h, np.ndarray) or h.shape != np.shape(r):
            cosines.extend([0.0] * rr.shape[0])  # absent or reshaped: counts as a miss per row
            continue
        hh = h.astype(np.float64).reshape(rr.shape)
        num = (rr * hh).sum(axis=1)
        den = np.linalg.norm(rr, axis=1) * np.linalg.norm(hh, axis=1)
        cosines.extend((num / np.maximum(den, 1e-12)).tolist())
    return {"cosine": float(np.mean(cosines)), "min_cosine": float(np.min(cosines))}


def _tensor_metrics(ref: Sequence[Any], hyp: Sequence[Any]) -> dict[str, float]:
    max_abs = 0.0
    scale = 0.0
    for r, h in zip(ref, hyp, strict=True):
        ra = np.asarray(r, dtype=np.float64)
        if not isinstance(h, np.ndarray) or h.shape != ra.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf")}
        max_abs = max(max_abs, float(np.max(np.abs(ra - h.astype(np.float64)))))
        scale = max(scale, float(np.max(np.abs(ra))))
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale else (0.0 if max_abs == 0 else float("inf"))}


@dataclass(frozen=True)
class GuardResult:
    """Every metric of every comparable output, and which guards hold."""

    metrics: dict[str, dict[str, float]]  # output -> metric -> value
    guards: tuple[Guard, ...]

    def value(self, guard: Guard) -> float:
        return self.metrics.get(guard.output, {}).get(guard.metric, float("nan"))

    @property
    def failed(self) -> list[Guard]:
        return [g for g in self.guards if not g.holds(self.value(g))]

    @property
    def holds(self) -> bool:
        return not self.failed

    @property
    def shortfall(self) -> float:
        """Sum of the guards' shortfalls: the fallback's measure of harm."""
        return sum(g.shortfall(self.value(g)) if self.value(g) == self.value(g) else 1.0 for g in self.guards)

    def to_json(self) -> dict[str, Any]:
        return {
            "holds": self.holds,
            "metrics": {o: {k: round(v, 6) for k, v in m.items()} for o, m in self.metrics.items()},
            "guards": [
                {"guard": str(g), "value": round(self.value(g), 6), "holds": g.holds(self.value(g))}
                for g in self.guards
            ],
        }


def default_guards(reference: Sequence[Mapping[str, Any]]) -> list[Guard]:
    """One default guard per output the FP32 graph produced (by its type)."""
    out = []
    for name, kind in _kinds(reference).items():
        metric, op, threshold = DEFAULT_GUARDS[kind]
        out.append(Guard(name, metric, op, threshold))
    return out


def _kinds(reference: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for outputs in reference:
        for name, value in outputs.items():
            kind = output_kind(value)
            if kind is not None and name not in kinds:
                kinds[name] = kind
    return kinds


def evaluate(
    reference: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]], guards: Sequence[Guard]
) -> GuardResult:
    """Compare per-request outputs (FP32 ``reference`` vs ``candidate``) and check ``guards``."""
    kinds = _kinds(reference)
    for g in guards:
        if g.output not in kinds:
            raise UsageError(
                f"--guard {g}: the graph produced no comparable output {g.output!r} on the held-out inputs; "
                f"fix: guard one of {', '.join(sorted(kinds)) or '(none: check --inputs)'}"
            )
        if g.metric not in METRICS[kinds[g.output]]:
            raise UsageError(
                f"--guard {g}: {g.output!r} is a {kinds[g.output]} output; fix: use one of "
                f"{', '.join(METRICS[kinds[g.output]])}"
            )
    fns = {"text": _text_metrics, "embedding": _embedding_metrics, "tensor": _tensor_metrics}
    metrics: dict[str, dict[str, float]] = {}
    for name, kind in kinds.items():
        pairs = [(r[name], c.get(name)) for r, c in zip(reference, candidate, strict=True) if r.get(name) is not None]
        metrics[name] = fns[kind]([p[0] for p in pairs], [p[1] for p in pairs])
    return GuardResult(metrics, tuple(guards))
