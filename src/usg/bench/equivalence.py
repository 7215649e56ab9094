"""Are two systems' outputs the same? OCR text must be equal, embeddings within a cosine tolerance,
scores inside structured outputs (the example's ``relevance``) within an absolute tolerance.

Every benchmark target returns its outputs as a dict of output name → value; ``normalize``
turns OCR ``lines`` (dicts with ``text``) into the list of texts, so USG, the baselines and a
remote server compare on what a user reads. A baseline whose outputs differ gets no ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["COSINE_TOL", "Equivalence", "check_equivalence", "compare_outputs", "normalize"]

COSINE_TOL = 1e-4
SCORE_TOL = 1e-3  # scores computed from embeddings (a cosine rounded to 4 decimals) inside dict/list outputs


def normalize(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Comparable outputs: lines → list of texts, arrays → float64 vectors, lists of numbers → arrays."""
    out: dict[str, Any] = {}
    for name, value in outputs.items():
        if value is None:
            continue
        if isinstance(value, list) and value and all(isinstance(v, Mapping) and "text" in v for v in value):
            out[name] = [str(v["text"]) for v in value]
        elif _numeric(value):
            out[name] = np.asarray(value, dtype=np.float64).reshape(-1)
        elif isinstance(value, list) and not value:
            out[name] = []
        else:
            out[name] = value
    return out


def _numeric(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, (int, float, list)) for v in value)


@dataclass
class Equivalence:
    system: str
    reference: str
    samples: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "reference": self.reference,
            "samples": self.samples,
            "ok": self.ok,
            "problems": self.problems,
        }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_outputs(
    reference: Mapping[str, Any], other: Mapping[str, Any], *, where: str = "", tol: float = COSINE_TOL
) -> list[str]:
    """Differences between two outputs (both normalized here); empty when equivalent."""
    ref, oth = normalize(reference), normalize(other)
    problems: list[str] = []
    prefix = f"{where}: " if where else ""
    for name in sorted(set(ref) | set(oth)):
        if name not in oth:
            problems.append(f"{prefix}output {name!r} missing (reference has it)")
            continue
        if name not in ref:
            problems.append(f"{prefix}output {name!r} present but the reference has none")
            continue
        a, b = ref[name], oth[name]
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            if a.shape != b.shape:
                problems.append(f"{prefix}output {name!r} shape {b.shape}, reference {a.shape}")
                continue
            cos = _cosine(a, b)
            if 1.0 - cos > tol:
                problems.append(f"{prefix}output {name!r}: cosine {cos:.6f} to the reference (tolerance {tol:g})")
        elif not _close(a, b):
            problems.append(f"{prefix}output {name!r}: {_short(b)} != reference {_short(a)}")
    return problems


def _close(a: Any, b: Any, tol: float = SCORE_TOL) -> bool:
    """Equal, except that floats (such as relevance scores inside a dict) may differ by ``tol``."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check_equivalence(
    system: str, reference_name: str, pairs: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]]
) -> Equivalence:
    """Compare ``(sample, reference_outputs, system_outputs)`` pairs."""
    eq = Equivalence(system, reference_name, len(pairs))
    for sample, ref, oth in pairs:
        eq.problems.extend(compare_outputs(ref, oth, where=sample))
    return eq


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."
