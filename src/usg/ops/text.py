"""Text-embedding node functions: how relevant a document's lines are to a query."""

from __future__ import annotations

from typing import Any

import numpy as np

from usg.ops.signature import ListOf, op
from usg.specs import TensorSpec

__all__ = ["query_lines", "relevance"]

_EMBEDDING = TensorSpec("float32", (1, None))


def _unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0.0 else v


@op(inputs={"lines": ListOf(), "query": None}, outputs={"texts": ListOf()})
def query_lines(lines: list[dict[str, Any]], query: str) -> dict[str, Any]:
    """The texts of OCR ``lines``, passed on only when a ``query`` was sent.

    Wiring ``query`` in makes the executor prune this node (and the per-line embeddings below
    it) for a request without a query, so a document alone does not embed every line.
    """
    del query
    return {"texts": [str(line["text"]) for line in lines]}


@op(
    inputs={
        "query": _EMBEDDING,
        "document": _EMBEDDING,
        "lines": ListOf(_EMBEDDING),
        "texts": ListOf(),
    },
    outputs={"summary": None},
)
def relevance(query: np.ndarray, document: np.ndarray, lines: list[np.ndarray], texts: list[str]) -> dict[str, Any]:
    """Cosine similarity of a query embedding with a document's embedding and with each of its lines.

    ``summary`` is ``{"document": cos, "lines": [cos per line], "best_line": {"index", "text",
    "score"}}`` (``best_line`` is ``None`` when the document has no lines). The embeddings need
    not be normalised; scores are rounded to 4 decimals.
    """
    if len(lines) != len(texts):
        raise ValueError(f"{len(lines)} line embeddings for {len(texts)} line texts; wire both from the same lines")
    q = _unit(query)
    scores = [round(float(np.dot(q, _unit(e))), 4) for e in lines]
    best = None
    if scores:
        i = int(np.argmax(scores))
        best = {"index": i, "text": texts[i], "score": scores[i]}
    doc = round(float(np.dot(q, _unit(document))), 4)
    return {"summary": {"document": doc, "lines": scores, "best_line": best}}
