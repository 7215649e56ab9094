"""Render findings as plain text for a terminal: grouped by file, worst first, then the matrix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from usg.doctor.findings import Finding, Severity
from usg.doctor.matrix import root_cause_matrix

__all__ = ["format_evidence", "render_text"]

_COLORS = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _value(v: Any, limit: int = 120) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_evidence(evidence: dict[str, Any]) -> str:
    """``key=value`` pairs, compact, skipping empty values."""
    return "  ".join(f"{k}={_value(v)}" for k, v in evidence.items() if v is not None and v != [])


def summary_line(findings: Sequence[Finding]) -> str:
    n = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    return f"{n[Severity.ERROR]} error(s), {n[Severity.WARNING]} warning(s), {n[Severity.INFO]} info"


def render_text(
    findings: Sequence[Finding],
    *,
    color: bool = False,
    checked: Sequence[str] = (),
    elapsed_s: float | None = None,
) -> str:
    def style(text: str, **kw: Any) -> str:
        return click.style(text, **kw) if color else text

    lines: list[str] = []
    head = "usg doctor"
    if checked:
        head += f": {len(checked)} target(s) checked"
    if elapsed_s is not None:
        head += f" in {elapsed_s:.2f} s"
    lines += [style(head, bold=True), ""]
    by_file: dict[str, list[Finding]] = {}
    for f in findings:
        by_file.setdefault(f.location.file, []).append(f)
    for file, group in by_file.items():
        lines.append(style(file, bold=True, underline=True))
        for f in sorted(group, key=lambda f: (-f.severity.rank, f.location.line or 0, f.code)):
            where = []
            if f.location.line is not None:
                where.append(f"line {f.location.line}" + (f":{f.location.column}" if f.location.column else ""))
            if f.location.element:
                where.append(f.location.element)
            sev = style(f"{f.severity.value.upper():<8}", fg=_COLORS[f.severity], bold=True)
            stage = "" if f.stage.value == "static" else f"  [{f.stage.value}]"
            code = style(f.code.ljust(10), bold=True)
            lines.append(f"  {sev}{code} {'  '.join(where)}{stage}".rstrip())
            lines.append(f"           {f.message}")
            ev = format_evidence(f.evidence)
            if ev:
                lines.append(style(f"           evidence: {ev}", dim=True))
            lines.append(f"           {style('fix:', fg='green')} {f.fix}")
        lines.append("")
    if not findings:
        lines += ["no findings", ""]
    rows = root_cause_matrix(findings)
    lines.append(style("Root-cause matrix", bold=True))
    lines.append(f"  {'root cause':<22}{'findings':>9}  {'worst':<8} caught by")
    for row in rows:
        if not row.count:
            continue
        worst = row.worst.value if row.worst else "-"
        stages = ", ".join(f"{s.value} ({row.by_stage[s]})" for s in row.stages)
        lines.append(f"  {row.root_cause.value:<22}{row.count:>9}  {worst:<8} {stages}")
    clean = [row.root_cause.value for row in rows if not row.count]
    if clean:
        lines.append(style(f"  {'(0 findings)':<22}{'0':>9}  {'-':<8} {', '.join(clean)}", dim=True))
    lines += ["", style(summary_line(findings), bold=True)]
    return "\n".join(lines) + "\n"
