"""``usg index build|add|remove|info``: document indexes of OCR'd images and text files."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from usg.cli import EXIT_FAILED
from usg.cli.common import err_console, load_graph_for_cli, out_console
from usg.errors import UsageError

if TYPE_CHECKING:
    from usg.index.build import Unreadable

__all__ = ["DEFAULT_GRAPH", "index"]

DEFAULT_GRAPH = Path(__file__).resolve().parents[3] / "examples" / "document_ocr" / "graph.yaml"


def _graph_path(graph: str | None, recorded: str | None = None) -> Path:
    if graph:
        return Path(graph)
    if recorded and Path(recorded).is_file():
        return Path(recorded)
    if DEFAULT_GRAPH.is_file():
        return DEFAULT_GRAPH
    raise UsageError(
        "no graph given and the bundled examples/document_ocr/graph.yaml is not on disk; "
        "fix: pass --graph GRAPH (a document graph with OCR and a text encoder)"
    )


@contextmanager
def _progress(total: int, what: str) -> Iterator[Progress]:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[lines]} lines"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("[dim]{task.fields[doc]}"),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        bar.add_task(what, total=total, lines=0, doc="")
        yield bar


def _advance(bar: Progress) -> Callable[[str, int], None]:
    counted = {"lines": 0}

    def step(doc_id: str, n_lines: int) -> None:
        counted["lines"] += n_lines
        bar.update(bar.task_ids[0], advance=1, lines=counted["lines"], doc=doc_id[-40:])

    return step


_STRICT = click.option(
    "--strict",
    is_flag=True,
    help="Stop at the first document that cannot be read (default: skip it, index the rest, list it at the end "
    "and exit 1).",
)


def _report_unreadable(unreadable: list[Unreadable]) -> str:
    """Print each skipped document with its reason; the summary's clause about them."""
    for u in unreadable:
        err_console.print(f"[yellow]skipped[/] {u.doc_id}: {u.reason}", markup=True, highlight=False, soft_wrap=True)
    if not unreadable:
        return ""
    return (
        f"; {len(unreadable)} document(s) could not be read and are not indexed "
        "(listed above; fix them and run usg index add)"
    )


@click.group("index")
def index() -> None:
    """Index scanned documents (images, OCR'd by the graph) and .txt files for `usg search`."""


@index.command("build")
@click.argument("folder", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Index folder to write.")
@click.option("--graph", default=None, help="Document graph (default: the bundled examples/document_ocr/graph.yaml).")
@click.option(
    "--dim",
    type=click.IntRange(min=1),
    default=None,
    help="Width of the learned head (default: 128 when there are ≥ 1024 lines, else the encoder's width).",
)
@click.option(
    "--refine/--no-refine",
    default=True,
    help="Keep residual codes of what the head leaves out and re-rank with them (default: on; "
    "--no-refine makes a smaller index with lower recall).",
)
@click.option("--collection", default=None, help="Collection (shard) name (default: the folder's name).")
@click.option("--force", is_flag=True, help="Replace an existing index at --output.")
@_STRICT
def build(
    folder: str,
    output: str,
    graph: str | None,
    dim: int | None,
    refine: bool,
    collection: str | None,
    force: bool,
    strict: bool,
) -> None:
    """Build an index of the images and .txt files in DIR."""
    from usg.index.build import build_index, scan_inputs

    out = Path(output)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UsageError(f"{out} exists and is not empty; fix: pass --force to replace it, or another -o")
        if not (out / "manifest.json").is_file():
            raise UsageError(f"{out} is not a usg index; refusing to delete it with --force; fix: choose another -o")
        shutil.rmtree(out)
    files, skipped = scan_inputs([folder])
    if not files:
        raise UsageError(f"{folder} holds no images or .txt files; fix: point DIR at your scanned pages")
    g = load_graph_for_cli(_graph_path(graph))
    name = collection or Path(folder).resolve().name
    t0 = time.perf_counter()
    unreadable: list[Unreadable] = []
    with _progress(len(files), "indexing") as bar:
        idx = build_index(
            g,
            files,
            out,
            collection=name,
            dim=dim,
            refine=refine,
            progress=_advance(bar),
            note=lambda m: err_console.print(f"[yellow]note:[/] {m}"),
            unreadable=None if strict else unreadable,
        )
    bad = _report_unreadable(unreadable)
    secs = time.perf_counter() - t0
    n = sum(len(s) for s in idx.shards.values())
    head = idx.manifest["head"]
    err_console.print(
        f"indexed {len(files) - len(unreadable)} document(s), {n} lines into {out} (collection {name!r}) "
        f"in {secs:.1f} s "
        f"({n / max(secs, 1e-9):.0f} lines/s); head {head['kind']} {head['in_dim']}→{head['out_dim']}"
        + (f" keeps {head['explained']:.1%} of the energy" if head["kind"] == "pca" else "")
        + (f", re-ranked by {head['residual']['bytes_per_vector']} B of residual code" if head.get("residual") else "")
        + (f"; skipped {len(skipped)} other file(s)" if skipped else "")
        + bad
    )
    if unreadable:  # the index is written, but not everything asked for is in it (the exit-code rule: 1)
        sys.exit(EXIT_FAILED)


@index.command("add")
@click.argument("index_path", metavar="INDEX", type=click.Path(exists=True, file_okay=False))
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--collection", default=None, help="Collection to add to (default: the only one, or the folder's name).")
@click.option("--graph", default=None, help="Document graph (default: the one the index was built with).")
@_STRICT
def add(index_path: str, paths: tuple[str, ...], collection: str | None, graph: str | None, strict: bool) -> None:
    """Add images / .txt files (or folders of them); changed documents are re-indexed, unchanged skipped."""
    from usg.index.build import add_documents, scan_inputs
    from usg.index.store import DocumentIndex

    idx = DocumentIndex.open(index_path)
    files, _ = scan_inputs(paths)
    if not files:
        raise UsageError(f"{', '.join(paths)}: no images or .txt files; fix: pass images or .txt files")
    if collection is None:
        collection = next(iter(idx.shards)) if len(idx.shards) == 1 else Path(paths[0]).resolve().name
    g = load_graph_for_cli(_graph_path(graph, idx.manifest.get("graph")))
    with _progress(len(files), f"adding to {collection}") as bar:
        report = add_documents(idx, g, files, collection=collection, progress=_advance(bar), strict=strict)
    bad = _report_unreadable(report.unreadable)
    err_console.print(
        f"collection {collection!r}: {len(report.added)} added, {len(report.replaced)} replaced (changed), "
        f"{len(report.unchanged)} unchanged; {report.lines} lines indexed{bad}"
    )
    if report.unreadable:
        sys.exit(EXIT_FAILED)


@index.command("remove")
@click.argument("index_path", metavar="INDEX", type=click.Path(exists=True, file_okay=False))
@click.argument("doc_ids", nargs=-1, required=True, metavar="DOC_ID...")
@click.option("--collection", default=None, help="Collection holding them (default: the only one).")
def remove(index_path: str, doc_ids: tuple[str, ...], collection: str | None) -> None:
    """Remove documents by id (their path relative to the indexed folder)."""
    from usg.index.build import remove_documents
    from usg.index.store import DocumentIndex

    idx = DocumentIndex.open(index_path)
    if collection is None:
        if len(idx.shards) != 1:
            raise UsageError(f"the index has collections {sorted(idx.shards)}; fix: pass --collection NAME")
        collection = next(iter(idx.shards))
    removed = remove_documents(idx, list(doc_ids), collection=collection)
    err_console.print(f"removed {len(removed)} document(s) from {collection!r}")


@index.command("info")
@click.argument("index_path", metavar="INDEX", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--documents", is_flag=True, help="List the documents of each collection.")
def info(index_path: str, as_json: bool, documents: bool) -> None:
    """Collections, sizes, head and encoder of an index."""
    from usg.index.store import DocumentIndex

    idx = DocumentIndex.open(index_path)
    stats = idx.stats()
    if documents:
        for name, shard in idx.shards.items():
            stats["collections"][name]["document_ids"] = sorted(shard.documents)
    if as_json:
        out_console.print(json.dumps(stats), markup=False, highlight=False)
        return
    head, enc = stats["head"], stats["encoder"]
    out_console.print(
        f"{index_path}: {stats['library']}, head {head['kind']} {head['in_dim']}→{head['out_dim']}, "
        f"encoder sha256 {enc['sha256'][:12]}… ({enc['path']})"
    )
    table = Table("collection", "documents", "lines", "bytes")
    for name, c in stats["collections"].items():
        table.add_row(name, str(c["documents"]), str(c["lines"]), str(c["bytes"]))
    out_console.print(table)
    if documents:
        for name, c in stats["collections"].items():
            out_console.print(f"[bold]{name}[/]: " + ", ".join(c["document_ids"]))
