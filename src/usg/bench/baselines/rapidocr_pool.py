"""Baseline ``rapidocr``: RapidOCR's own engine called per request from a thread pool.

What it does per request: ``RapidOCR()(image_bgr)`` (det → cls → rec, RapidOCR's default
configuration and ONNX Runtime threads, rec batched 6 crops at a time as RapidOCR does), then
MiniLM (USG's tokenizer backend + an ONNX Runtime session with the graph's thread count) embeds
the OCR text joined with newlines and the query text, and with both each OCR line (the graph's
``relevance``) — the same work as the graph. One engine
is shared by the pool's threads (ONNX Runtime sessions are thread-safe); the pool has as many
threads as the benchmark has concurrent clients.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from usg.bench.baselines.models import TextEmbedder
from usg.bench.baselines.pipeline import doc_models
from usg.bench.samples import Sample
from usg.errors import MissingDependency
from usg.graph.model import Graph
from usg.ops.text import relevance

__all__ = ["RapidOcrPoolTarget"]


class RapidOcrPoolTarget:
    name = "rapidocr"

    def __init__(self, graph: Graph, *, workers: int) -> None:
        self.models = doc_models(graph, "rapidocr")
        self.workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._engine: Any = None
        self._embedder: TextEmbedder | None = None
        self._text_score = float(self.models.node_options.get("lines", {}).get("text_score", 0.5))

    async def start(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError:
            raise MissingDependency("rapidocr_onnxruntime", "ocr", "the rapidocr baseline") from None
        self._engine = RapidOCR()
        m = self.models
        self._embedder = TextEmbedder(
            m.paths["tokenizer"], m.paths["minilm"], threads=m.threads["minilm"], max_length=m.tokenizer_max_length
        )
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="rapidocr")

    def _one(self, image: np.ndarray | None, text: str | None) -> dict[str, Any]:
        assert self._embedder is not None
        out: dict[str, Any] = {}
        if image is not None:
            result, _ = self._engine(np.ascontiguousarray(image[:, :, ::-1]), text_score=self._text_score)
            lines = [{"text": str(r[1]), "score": float(r[2]), "box": r[0]} for r in (result or [])]
            out["lines"] = lines
            joined = "\n".join(line["text"] for line in lines)
            if joined:
                out["ocr_embedding"] = self._embedder.embed([joined])
        if text is not None:
            out["text_embedding"] = self._embedder.embed([text])
            if "ocr_embedding" in out:  # the example's relevance: the query against each OCR line
                texts = [line["text"] for line in out["lines"]]
                embedded = self._embedder.embed(texts)
                per_line = [embedded[i : i + 1] for i in range(len(texts))]
                summary = relevance(out["text_embedding"], out["ocr_embedding"], per_line, texts)
                out["relevance"] = summary["summary"]
        return out

    async def infer(self, sample: Sample) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._one, sample.image, sample.text)

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
