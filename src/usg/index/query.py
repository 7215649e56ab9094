"""Queries against an index: a text (its lines are searched) or an image (its OCR text's embedding
is compared with the indexed pages: documents that read alike).

:class:`Searcher` pairs an open :class:`~usg.index.store.DocumentIndex` with an executor of the
graph's encoder. The CLI uses the text-only line graph (tokenizer + encoder: fast to load); the
server passes its own running executor of the whole graph.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.graph import Graph
from usg.index.encoder import EncoderChain, file_digest, find_text_encoder
from usg.index.store import DocumentIndex, SearchHit
from usg.runtime import Executor, InferResult

__all__ = ["MAX_QUERY_CHARS", "Searcher", "check_query"]

MAX_QUERY_CHARS = 4096

Infer = Callable[[Mapping[str, Any]], Awaitable[InferResult]]


def check_query(query: Any) -> str:
    if not isinstance(query, str):
        raise InputError(
            f"query must be a string, got {type(query).__name__}", field="query", fix='send {"query": "some text"}'
        )
    text = query.strip()
    if not text:
        raise InputError("query is empty", field="query", fix="send the text to look for")
    if len(text) > MAX_QUERY_CHARS:
        raise InputError(
            f"query has {len(text)} characters, the limit is {MAX_QUERY_CHARS}",
            field="query",
            fix="search for a shorter text (a line or a sentence)",
        )
    return text


class Searcher:
    """Embeds queries with ``graph``'s encoder and searches ``index``.

    The encoder's digest is checked once here: an index built with another encoder raises
    :class:`~usg.index.store.EncoderMismatch` before any query is taken.
    """

    def __init__(self, index: DocumentIndex, graph: Graph) -> None:
        self.index = index
        self.graph = graph
        self.chain: EncoderChain = find_text_encoder(graph)
        self.digest = file_digest(self.chain.encoder_path(graph))
        index.check_encoder(self.digest)

    @property
    def supports_images(self) -> bool:
        return self.chain.image_input is not None and self.chain.page_output is not None

    def _text_hits(self, result: InferResult, k: int, collections: list[str] | None) -> list[SearchHit]:
        emb = np.asarray(result.outputs[self.chain.output], dtype=np.float32).reshape(1, -1)
        return self.index.search(emb, encoder_digest=self.digest, k=k, collections=collections)

    def _image_inputs(self, image: Any) -> dict[str, Any]:
        if self.chain.image_input is None or self.chain.page_output is None:
            raise InputError(
                f"graph {self.graph.name!r} has no image input with an OCR text embedding, so only text "
                "queries are supported",
                field="image",
                fix='send {"query": "some text"}',
            )
        return {self.chain.image_input: image}

    def _image_hits(
        self, result: InferResult, k: int, collections: list[str] | None
    ) -> tuple[list[SearchHit], list[str]]:
        chain = self.chain
        lines = [str(ln["text"]) for ln in result.outputs.get(chain.lines_output or "", None) or []]
        page = result.outputs.get(chain.page_output or "")
        if page is None:
            raise InputError(
                "no text was read from the query image, so there is nothing to compare pages by",
                field="image",
                fix="send a page with legible text, or a text query",
            )
        emb = np.asarray(page, dtype=np.float32).reshape(1, -1)
        hits = self.index.search(emb, encoder_digest=self.digest, k=k, pages=True, collections=collections)
        return hits, lines

    async def search_text(
        self, infer: Infer, query: Any, *, k: int = 10, collections: list[str] | None = None
    ) -> list[SearchHit]:
        """Top-``k`` lines for a text; ``infer`` runs the graph (e.g. ``executor.infer``)."""
        result = await infer({self.chain.text_input: check_query(query)})
        return self._text_hits(result, k, collections)

    async def search_image(
        self, infer: Infer, image: Any, *, k: int = 10, collections: list[str] | None = None
    ) -> tuple[list[SearchHit], list[str]]:
        """Documents whose text reads like the image's OCR text; and the OCR lines read from it."""
        result = await infer(self._image_inputs(image))
        return self._image_hits(result, k, collections)

    def search_text_sync(
        self, executor: Executor, query: Any, *, k: int = 10, collections: list[str] | None = None
    ) -> list[SearchHit]:
        result = executor.infer_sync({self.chain.text_input: check_query(query)})
        return self._text_hits(result, k, collections)

    def search_image_sync(
        self, executor: Executor, image: Any, *, k: int = 10, collections: list[str] | None = None
    ) -> tuple[list[SearchHit], list[str]]:
        result = executor.infer_sync(self._image_inputs(image))
        return self._image_hits(result, k, collections)
