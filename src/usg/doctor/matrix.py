"""The root-cause matrix every doctor report carries.

One row per :class:`RootCause` class: how many findings, the worst severity,
and which stages (static / dry_run / parity / logs) caught it — so a reader sees
at a glance whether a class of failure is caught before deploy or only in logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from usg.doctor.findings import Finding, RootCause, Severity, Stage

__all__ = ["MatrixRow", "root_cause_matrix"]


@dataclass(frozen=True)
class MatrixRow:
    root_cause: RootCause
    count: int
    worst: Severity | None
    by_stage: dict[Stage, int]

    @property
    def stages(self) -> list[Stage]:
        return [s for s in Stage if self.by_stage.get(s)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "root_cause": self.root_cause.value,
            "count": self.count,
            "worst_severity": self.worst.value if self.worst else None,
            "stages": [s.value for s in self.stages],
            "by_stage": {s.value: self.by_stage.get(s, 0) for s in Stage},
        }


def root_cause_matrix(findings: Iterable[Finding]) -> list[MatrixRow]:
    """One row per root-cause class (all classes, in declaration order), from any stage's findings."""
    counts: dict[RootCause, dict[Stage, int]] = {rc: {} for rc in RootCause}
    worst: dict[RootCause, Severity] = {}
    for f in findings:
        per = counts[f.root_cause]
        per[f.stage] = per.get(f.stage, 0) + 1
        if f.root_cause not in worst or f.severity.rank > worst[f.root_cause].rank:
            worst[f.root_cause] = f.severity
    return [MatrixRow(rc, sum(counts[rc].values()), worst.get(rc), dict(counts[rc])) for rc in RootCause]
