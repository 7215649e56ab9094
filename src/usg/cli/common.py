"""Helpers shared by CLI commands: consoles, graph loading with export progress."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from usg.graph import Graph

__all__ = ["GRAPH_FILE", "err_console", "escape", "load_graph_for_cli", "out_console"]

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
