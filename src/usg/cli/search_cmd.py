"""``usg search INDEX "query" [-k 10] [--json]``: the lines of indexed documents closest to a text."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from usg.cli.common import err_console, load_graph_for_cli, out_console
from usg.errors import UsageError

__all__ = ["search"]


@click.command("search")
@click.argument("index_path", metavar="INDEX", type=click.Path(exists=True, file_okay=False))
@click.argument("query", required=False)
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 1000), help="Number of results.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {query, results, ms}.")
@click.option("--image", "image", type=click.Path(exists=True, dir_okay=False), help="Find pages that read like it.")
@click.option("--collection", "collections", multiple=True, help="Search only these collections (repeatable).")
@click.option("--graph", default=None, help="Graph to embed the query with (default: the index's).")
def search(
    index_path: str,
    query: str | None,
    k: int,
    as_json: bool,
    image: str | None,
    collections: tuple[str, ...],
    graph: str | None,
) -> None:
    """Search an index built by `usg index build` with a text (lines) or an --image (pages)."""
    from usg.cli.index_cmd import _graph_path
    from usg.index.encoder import query_graph
    from usg.index.query import Searcher
    from usg.index.store import DocumentIndex
    from usg.runtime import Executor

    if (query is None) == (image is None):
        raise UsageError('give a text query or --image PATH (one of them); fix: usg search INDEX "total due"')
    idx = DocumentIndex.open(index_path)
    g = load_graph_for_cli(_graph_path(graph, idx.manifest.get("graph")))
    searcher = Searcher(idx, g)  # refuses a graph whose encoder is not the index's
    run_graph = query_graph(g, searcher.chain) if image is None else g
    lines: list[str] = []
    only = list(collections) or None
    with Executor(run_graph) as ex:
        ex.start_sync()
        t0 = time.perf_counter()
        if image is None:
            hits = searcher.search_text_sync(ex, query, k=k, collections=only)
        else:
            hits, lines = searcher.search_image_sync(ex, Path(image), k=k, collections=only)
    ms = (time.perf_counter() - t0) * 1000
    if as_json:
        body: dict[str, Any] = {"query": query, "results": [h.to_dict() for h in hits], "ms": round(ms, 2)}
        if image is not None:
            body["image_lines"] = lines
        out_console.print(json.dumps(body, ensure_ascii=False), markup=False, highlight=False)
        return
    if not hits:
        err_console.print("no results (the index is empty)")
        return
    table = Table("#", "score", "document", "text" if image is None else "kind", "box")
    for i, h in enumerate(hits, 1):
        box = "" if h.box is None else "[" + ", ".join(f"{x:.0f},{y:.0f}" for x, y in h.box) + "]"
        table.add_row(str(i), f"{h.score:.3f}", f"{h.collection}/{h.document}", h.text or h.kind, box)
    out_console.print(table)
    err_console.print(f"[dim]{len(hits)} result(s) in {ms:.0f} ms[/]")
