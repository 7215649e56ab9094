"""``usg doctor logs FILE|-``: classify error lines from serving/export logs into root causes."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from usg.doctor.findings import Finding, Severity
from usg.errors import UsageError

__all__ = ["exit_code", "logs", "render_findings"]


def render_findings(
    findings: Sequence[Finding], fmt: str, extra: dict[str, Any] | None = None, output: str | None = None
) -> None:
    """Render with the doctor's shared renderer (text/json/html/sarif, root-cause matrix included).

    ``extra`` sections (e.g. the parity shape table) are printed before a text report.
    """
    import sys as _sys

    from usg.doctor.render import render

    text = render(findings, fmt, color=output is None and fmt == "text" and _sys.stdout.isatty())
    if fmt == "text" and extra:
        sections = "\n".join(f"{title}\n{body}\n" for title, body in extra.items())
        text = f"{sections}\n{text}"
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


@click.command("logs")
@click.argument("source", type=str)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "html", "sarif"]), default="text", show_default=True
)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write the report to a file.")
@click.option("--no-unclassified", is_flag=True, help="Hide error lines no rule recognises (LOG000).")
def logs(source: str, fmt: str, output: str | None, no_unclassified: bool) -> None:
    """Classify the error lines of a log FILE (or - for stdin) into root causes, with a fix each.

    Knows Triton, ONNX Runtime, torch.onnx export, TensorRT, vLLM and transformers messages;
    anything else that looks like an error is reported as unclassified (LOG000).
    """
    from usg.doctor.logs.classify import classify_text

    if source == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        try:
            with open(source, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(
                f"cannot read log file {source!r}: {exc.strerror}; fix: give a readable file or -"
            ) from exc
        name = source
    findings = classify_text(text, name)
    if no_unclassified:
        findings = [f for f in findings if f.code != "LOG000"]
    render_findings(findings, fmt, output=output)
    sys.exit(exit_code(findings))
