"""How well the example reads spaces with rec_pre's two width policies (``rapidocr``, ``per_line``).

Renders documents with known text (the example's sample page and the benchmark's four documents),
runs the example graph with each policy, and prints per policy the character accuracy against
the rendered text with spaces, without spaces, and the share of the text's spaces read.

    python examples/document_ocr/compare_widths.py
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from usg.bench.samples import default_samples
from usg.graph import Graph, load_graph
from usg.quantize.guard import char_accuracy
from usg.runtime import Executor
from usg.testing.documents import render_document

HERE = Path(__file__).resolve().parent


def documents() -> list[tuple[str, object, str]]:
    """(name, RGB image, the rendered text with one space between words)."""
    from make_sample import LINES  # the sample page's lines, next to this file

    from usg.bench import samples

    docs = [("sample.png", render_document(LINES), " ".join(line.text for line in LINES))]
    for sample, doc in zip(default_samples(), samples._DEFAULT_DOCS, strict=True):
        docs.append((sample.name, sample.image, " ".join(t for t, *_ in doc)))
    return docs


def with_widths(graph: Graph, policy: str) -> Graph:
    node = graph.nodes["rec_pre"]
    nodes = {**graph.nodes, "rec_pre": dataclasses.replace(node, options={**node.options, "widths": policy})}
    return dataclasses.replace(graph, nodes=nodes).without_cache()


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def main() -> None:
    import sys

    sys.path.insert(0, str(HERE))
    graph = load_graph(HERE / "graph.yaml", export_missing=True)
    docs = documents()
    print(f"{len(docs)} rendered documents, {sum(len(t) for _, _, t in docs)} characters")
    for policy in ("rapidocr", "per_line"):
        truth, read = [], []
        with Executor(with_widths(graph, policy)) as ex:
            for _, image, text in docs:
                lines = ex.infer_sync({"image": image}, timeout_s=120).outputs["lines"]
                truth.append(words(text))
                read.append(words(" ".join(line["text"] for line in lines)))
        with_spaces = char_accuracy(truth, read)
        no_spaces = char_accuracy([t.replace(" ", "") for t in truth], [r.replace(" ", "") for r in read])
        spaces = sum(r.count(" ") for r in read) / sum(t.count(" ") for t in truth)
        print(
            f"widths: {policy:9s} char accuracy {with_spaces:.2%} with spaces, {no_spaces:.2%} without; "
            f"spaces read / spaces in the text {spaces:.0%}"
        )
        for (name, _, _), r in zip(docs, read, strict=True):
            print(f"    {name}: {r}")


if __name__ == "__main__":
    main()
