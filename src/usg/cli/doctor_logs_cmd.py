"""``usg doctor logs FILE|-``: classify error lines from serving/export logs into root causes."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from usg.doctor.findings import Finding, Severity
from usg.errors import UsageError

__all__ = ["exit_code", "logs", "render_findings"]


def render_findings(findings: Sequence[Finding], fmt: str, extra: dict[str, Any] | None = None) -> None:
    """Print findings as a rich table (``text``) or a JSON list of ``finding.to_dict()`` (``json``).

    The one rendering seam of the parity/logs commands, to be swapped for the shared renderer.
    """
    if fmt == "json":
        click.echo(json.dumps([f.to_dict() for f in findings], indent=2, default=str))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(soft_wrap=False)
    if not findings:
        console.print("[green]no findings[/green]")
        return
    table = Table(show_lines=True)
    for col in ("code", "severity", "root cause", "where", "message", "fix"):
        table.add_column(col, overflow="fold")
    colour = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
    for f in findings:
        table.add_row(
            f.code,
            f"[{colour[f.severity]}]{f.severity.value}[/]",
            f.root_cause.value,
            escape(str(f.location)),
            escape(f.message),  # messages hold "[triton]", "[E]": text, not markup
            escape(f.fix),
        )
    console.print(table)
    for title, text in (extra or {}).items():
        console.print(f"[bold]{escape(title)}[/bold]\n{escape(text)}")


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


@click.command("logs")
@click.argument("source", type=str)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-unclassified", is_flag=True, help="Hide error lines no rule recognises (LOG000).")
def logs(source: str, fmt: str, no_unclassified: bool) -> None:
    """Classify the error lines of a log FILE (or - for stdin) into root causes, with a fix each.

    Knows Triton, ONNX Runtime, torch.onnx export, TensorRT, vLLM and transformers messages;
    anything else that looks like an error is reported as unclassified (LOG000).
    """
    from usg.doctor.logs import classify_text

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
    render_findings(findings, fmt)
    sys.exit(exit_code(findings))
