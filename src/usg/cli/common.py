"""Helpers shared by CLI commands: consoles, graph loading with export progress."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from usg.graph import Graph

__all__ = ["err_console", "load_graph_for_cli", "out_console"]

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)


def load_graph_for_cli(path: str | Path) -> Graph:
    """Load a graph, exporting models it declares an ``export:`` recipe for (with a spinner on stderr)."""
    from usg.export import export_missing_models
    from usg.graph import load_graph
    from usg.graph.loader import parse_graph, read_graph_file

    p = Path(path).expanduser().resolve()
    data = read_graph_file(p)
    _name, _inputs, models, *_rest, problems = parse_graph(data, p.parent, str(p))
    missing = [m for m in models.values() if m.export and m.path is not None and not m.path.exists()]
    if missing and not problems:
        with err_console.status(f"exporting {', '.join(m.name for m in missing)} to ONNX (once; cached)"):
            export_missing_models(missing, log=lambda msg: err_console.print(f"[dim]{msg}[/]"))
    graph = load_graph(p)
    from usg.bench.tune import apply_sidecar, sidecar_path

    tuned = sidecar_path(p)
    if tuned.is_file():
        err_console.print(f"[dim]using tuned batch sizes and threads from {tuned} (delete it to undo)[/]")
        graph = apply_sidecar(graph, tuned)
    return graph
