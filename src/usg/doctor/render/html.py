"""Render findings as one self-contained HTML page (inline CSS, no scripts or external assets)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from usg.doctor.findings import Finding, Severity
from usg.doctor.matrix import root_cause_matrix
from usg.doctor.render.text import format_evidence, summary_line

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#1f2328;max-width:1200px}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;width:100%;margin:.5rem 0}
th,td{border:1px solid #d0d7de;padding:.35rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f6f8fa}
.sev{font-weight:700;text-transform:uppercase;font-size:.8rem;border-radius:4px;padding:.1rem .4rem}
.error{background:#ffebe9;color:#cf222e}.warning{background:#fff8c5;color:#9a6700}
.info{background:#ddf4ff;color:#0969da}
code,.ev{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.82rem}
.ev{color:#57606a;word-break:break-all}.zero{color:#8c959f}
.summary{font-weight:600}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def render_html(
    findings: Sequence[Finding],
    *,
    checked: Sequence[str] = (),
    elapsed_s: float | None = None,
    title: str = "usg doctor report",
) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="summary">{_e(summary_line(findings))}'
        + (f" &middot; {len(checked)} target(s)" if checked else "")
        + (f" &middot; {elapsed_s:.2f} s" if elapsed_s is not None else "")
        + "</p>",
        "<h2>Root-cause matrix</h2>",
        "<table><tr><th>root cause</th><th>findings</th><th>worst</th><th>caught by</th></tr>",
    ]
    for row in root_cause_matrix(findings):
        worst = f'<span class="sev {row.worst.value}">{row.worst.value}</span>' if row.worst else "-"
        stages = ", ".join(f"{s.value} ({row.by_stage[s]})" for s in row.stages) or "-"
        cls = "" if row.count else ' class="zero"'
        out.append(
            f"<tr{cls}><td>{_e(row.root_cause.value)}</td><td>{row.count}</td><td>{worst}</td>"
            f"<td>{_e(stages)}</td></tr>"
        )
    out.append("</table><h2>Findings</h2>")
    if not findings:
        out.append("<p>No findings.</p>")
    else:
        out.append("<table><tr><th>severity</th><th>code</th><th>where</th><th>finding</th></tr>")
        for f in sorted(findings, key=lambda f: (f.location.file, -f.severity.rank, f.code)):
            sev = f.severity.value if f.severity in Severity else "info"
            ev = format_evidence(f.evidence)
            out.append(
                f'<tr><td><span class="sev {sev}">{_e(sev)}</span></td><td><code>{_e(f.code)}</code>'
                f"<br><small>{_e(f.root_cause.value)} &middot; {_e(f.stage.value)}</small></td>"
                f"<td><code>{_e(f.location)}</code></td>"
                f"<td>{_e(f.message)}"
                + (f'<div class="ev">evidence: {_e(ev)}</div>' if ev else "")
                + f"<div><b>fix:</b> {_e(f.fix)}</div></td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
