"""Helpers shared by CLI commands: consoles, graph loading with export progress."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from usg.graph import Graph

__all__ = ["err_console", "load_graph_for_cli", "out_console"]

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)


def load_graph_for_cli(path: str | Path, *, tuned: bool = True, quantized: bool = True) -> Graph:
    """Load a graph for a command: export models it has an ``export:`` recipe for (spinner on stderr),
    and, with ``tuned``, merge the ``GRAPH.tuned.yaml`` that ``usg tune`` wrote next to it."""
    from usg.graph import load_graph

    p = Path(path).expanduser().resolve()
    with err_console.status("loading graph (models missing on disk are exported to ONNX once)"):
        graph = load_graph(p, export_missing=True, log=lambda msg: err_console.print(f"[dim]{msg}[/]"))
    if tuned:
        from usg.graph.sidecar import apply_sidecar, sidecar_path

        sidecar = sidecar_path(p)
        if sidecar.is_file():
            err_console.print(f"[dim]using tuned batch sizes and threads from {sidecar} (delete it to undo)[/]")
            graph = apply_sidecar(graph, sidecar)
    if quantized:  # GRAPH.quant.yaml from `usg quantize`; commands pass quantized=False for --fp32
        from usg.graph.sidecar import apply_quant_sidecar, quant_sidecar_path

        qpath = quant_sidecar_path(p)
        if qpath.is_file():
            err_console.print(f"[dim]using quantized models from {qpath} (--fp32 ignores it)[/]")
            graph = apply_quant_sidecar(graph, qpath)
    return graph
