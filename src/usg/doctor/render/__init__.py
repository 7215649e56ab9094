"""Pick a renderer by format name: text, json, html or sarif."""

from __future__ import annotations

from collections.abc import Sequence

from usg.doctor.findings import Finding
from usg.errors import UsageError

__all__ = ["FORMATS", "render"]

FORMATS = ("text", "json", "html", "sarif")


def render(
    findings: Sequence[Finding],
    fmt: str = "text",
    *,
    color: bool = False,
    checked: Sequence[str] = (),
    elapsed_s: float | None = None,
) -> str:
    """Render findings (from any stage) in ``fmt``; every format carries the root-cause matrix."""
    if fmt == "text":
        from usg.doctor.render.text import render_text

        return render_text(findings, color=color, checked=checked, elapsed_s=elapsed_s)
    if fmt == "json":
        from usg.doctor.render.json import render_json

        return render_json(findings, checked=checked, elapsed_s=elapsed_s)
    if fmt == "html":
        from usg.doctor.render.html import render_html

        return render_html(findings, checked=checked, elapsed_s=elapsed_s)
    if fmt == "sarif":
        from usg.doctor.render.sarif import render_sarif

        return render_sarif(findings)
    raise UsageError(f"unknown format {fmt!r}; fix: use one of {', '.join(FORMATS)}")
