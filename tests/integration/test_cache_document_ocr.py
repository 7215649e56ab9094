"""The bundled document-OCR graph with its default in-memory cache: a repeated document is
answered from the cache (no OCR model runs) with outputs equal to an uncached run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from usg.graph import load_graph
from usg.runtime import Executor
from usg.testing.documents import Line, render_document

GRAPH = Path(__file__).resolve().parents[2] / "examples" / "document_ocr" / "graph.yaml"
SAMPLE = GRAPH.parent / "sample.png"


@pytest.fixture(scope="module")
def graph():
    return load_graph(GRAPH, export_missing=True)


def same(a, b) -> None:
    assert set(a.outputs) == set(b.outputs)
    assert a.outputs["lines"] == b.outputs["lines"]
    assert a.outputs.get("relevance") == b.outputs.get("relevance")
    for k in ("ocr_embedding", "text_embedding"):
        if k in a.outputs:
            np.testing.assert_array_equal(a.outputs[k], b.outputs[k])


def test_a_repeated_document_is_a_hit_equal_to_the_uncached_answer(graph):
    png = SAMPLE.read_bytes()
    other = render_document([Line("Invoice number 55012", size=26)])
    with Executor(graph, cache=False) as plain:
        want = plain.infer_sync({"image": png, "text": "total due"})
        want_other = plain.infer_sync({"image": other})
    with Executor(graph) as ex:
        first = ex.infer_sync({"image": png, "text": "total due"})
        second = ex.infer_sync({"image": png, "text": "total due"})
        third = ex.infer_sync({"image": other})
        stats = {n: (s.hits, s.misses, s.uncacheable, s.errors) for n, s in ex.cache.stats.items()}
    same(first, want)
    same(second, want)
    same(third, want_other)
    assert stats == {
        "lines": (1, 2, 0, 0),
        "ocr_emb": (1, 2, 0, 0),
        "text_emb": (1, 1, 0, 0),
        "line_emb": (1, 1, 0, 0),  # the image alone embeds no line
        "relevance": (1, 1, 0, 0),
    }
    assert {"det", "rec", "cls"} <= set(first.node_ms)
    assert set(second.node_ms) == set()  # every output from the cache: no node ran
    assert second.integrity["image"] == "sha256:" + hashlib.sha256(png).hexdigest()


def test_an_array_input_with_the_same_dtype_shape_and_bytes_is_a_hit(graph):
    image = render_document([Line("Thank you", size=32)])
    with Executor(graph) as ex:
        a = ex.infer_sync({"image": image})
        b = ex.infer_sync({"image": image.copy()})
        assert ex.cache.stats["lines"].hits == 1  # equal array bytes: the same key
    assert a.outputs["lines"] == b.outputs["lines"]
