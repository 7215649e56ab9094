"""Helpers shared by CLI commands: consoles, graph loading with export progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from usg.graph import Graph

__all__ = ["GRAPH_FILE", "dry_run_summary", "err_console", "escape", "load_graph_for_cli", "out_console"]

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)

#: the GRAPH argument of every command: a missing file is a command-line error (exit code 2)
GRAPH_FILE = click.Path(exists=True, dir_okay=False)


def load_graph_for_cli(path: str | Path, *, tuned: bool = True) -> Graph:
    """Load a graph for a command: export models it has an ``export:`` recipe for (spinner on stderr),
    and, with ``tuned``, merge the ``GRAPH.tuned.yaml`` that ``usg tune`` wrote next to it."""
    from usg.graph import load_graph

    p = Path(path).expanduser().resolve()
    with err_console.status("loading graph (models missing on disk are exported to ONNX once)"):
        graph = load_graph(p, export_missing=True, log=lambda msg: err_console.print(f"[dim]{escape(msg)}[/]"))
    if tuned:
        from usg.graph.sidecar import apply_sidecar, sidecar_path

        sidecar = sidecar_path(p)
        if sidecar.is_file():
            err_console.print(
                f"[dim]using tuned batch sizes and threads from {escape(str(sidecar))} (delete it to undo)[/]"
            )
            graph = apply_sidecar(graph, sidecar)
    return graph


def dry_run_summary(report: Any) -> list[str]:
    """For ``usg doctor --dry-run``: one line per graph that has no error and whose dry run raised no warning."""
    from usg.doctor.findings import Severity, Stage

    failed = {
        Path(f.location.file).resolve()
        for f in report.findings
        if f.severity is Severity.ERROR or (f.stage is Stage.DRY_RUN and f.severity is not Severity.INFO)
    }
    return [
        f"dry run passed: {t.path} — sample inputs went through every node within the models' contracts"
        for t in report.targets
        if t.kind == "graph" and Path(t.path).resolve() not in failed
    ]
