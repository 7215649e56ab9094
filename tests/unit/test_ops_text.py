"""usg.ops.text: the document example's relevance of a query to a page and to each of its lines."""

from __future__ import annotations

import numpy as np
import pytest

from usg.bench.equivalence import compare_outputs
from usg.ops.signature import signature_of
from usg.ops.text import query_lines, relevance


def _row(*values: float) -> np.ndarray:
    return np.asarray([values], dtype=np.float32)


def test_relevance_is_the_cosine_with_the_document_and_each_line() -> None:
    query = _row(1.0, 0.0, 0.0)
    document = _row(1.0, 1.0, 0.0)  # not normalised: cosine 0.7071
    lines = [_row(0.0, 1.0, 0.0), _row(3.0, 0.0, 4.0), _row(-1.0, 0.0, 0.0)]
    out = relevance(query=query, document=document, lines=lines, texts=["a", "b", "c"])["summary"]
    assert out == {
        "document": 0.7071,
        "lines": [0.0, 0.6, -1.0],
        "best_line": {"index": 1, "text": "b", "score": 0.6},
    }


def test_a_page_without_lines_has_no_best_line() -> None:
    out = relevance(query=_row(1.0, 0.0), document=_row(0.0, 1.0), lines=[], texts=[])["summary"]
    assert out == {"document": 0.0, "lines": [], "best_line": None}


def test_lines_and_texts_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 line embeddings for 1 line texts"):
        relevance(query=_row(1.0), document=_row(1.0), lines=[_row(1.0), _row(1.0)], texts=["a"])


def test_query_lines_passes_the_texts_on() -> None:
    lines = [{"text": "Total due", "score": 0.9, "box": []}, {"text": "EUR 1", "score": 0.8, "box": []}]
    assert query_lines(lines=lines, query="total") == {"texts": ["Total due", "EUR 1"]}
    sig = signature_of(query_lines)
    assert sig is not None and set(sig.inputs) == {"lines", "query"}  # the query gates the per-line embeddings


def test_bench_equivalence_allows_rounding_noise_in_relevance_but_not_another_best_line() -> None:
    ref = {
        "relevance": {
            "document": 0.2680,
            "lines": [0.2447, 0.4686],
            "best_line": {"index": 1, "text": "b", "score": 0.4686},
        }
    }
    close = {
        "relevance": {
            "document": 0.2681,
            "lines": [0.2446, 0.4686],
            "best_line": {"index": 1, "text": "b", "score": 0.4686},
        }
    }
    other = {
        "relevance": {"document": 0.2680, "lines": [0.5, 0.4686], "best_line": {"index": 0, "text": "a", "score": 0.5}}
    }
    assert compare_outputs(ref, close) == []
    assert compare_outputs(ref, other) and "relevance" in compare_outputs(ref, other)[0]
