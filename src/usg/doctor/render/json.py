"""Render findings as one JSON document: summary, root-cause matrix, findings."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from usg.doctor.findings import Finding, Severity
from usg.doctor.matrix import root_cause_matrix

__all__ = ["render_json", "report_dict"]


def report_dict(
    findings: Sequence[Finding], *, checked: Sequence[str] = (), elapsed_s: float | None = None
) -> dict[str, Any]:
    counts = {s.value: sum(1 for f in findings if f.severity is s) for s in Severity}
    return {
        "tool": "usg doctor",
        "summary": {**counts, "findings": len(findings), "targets": list(checked), "elapsed_s": elapsed_s},
        "root_cause_matrix": [row.to_dict() for row in root_cause_matrix(findings)],
        "findings": [f.to_dict() for f in findings],
    }


def render_json(findings: Sequence[Finding], *, checked: Sequence[str] = (), elapsed_s: float | None = None) -> str:
    return json.dumps(report_dict(findings, checked=checked, elapsed_s=elapsed_s), indent=2, default=str) + "\n"
