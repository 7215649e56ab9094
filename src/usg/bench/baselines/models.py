"""Model sessions the baselines use, built from the same backends and options as the graph."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TextEmbedder", "onnx_session", "run_stacked"]


def onnx_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime backend (USG's own, so session options match the graph), loaded."""
    from usg.backends.onnxruntime import OnnxRuntimeBackend

    backend = OnnxRuntimeBackend(path, {"intra_op_threads": threads} if threads else {})
    backend.load()
    return backend


def run_stacked(backend: Any, items: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run items of one shape as one batch; one [1,…] output per item."""
    name = next(iter(backend.input_specs))
    out = backend.infer({name: np.concatenate(list(items), axis=0)})
    first = next(iter(out.values()))
    return [first[i : i + 1] for i in range(len(items))]


class TextEmbedder:
    """Tokenizer + MiniLM: texts → [n, 384] L2-normalised embeddings (padded to the longest text)."""

    def __init__(self, tokenizer: Path, model: Path, *, threads: int, max_length: int) -> None:
        from usg.backends.tokenizer import TokenizerBackend

        self.tokenizer = TokenizerBackend(tokenizer, {"max_length": max_length})
        self.tokenizer.load()
        self.model = onnx_session(model, threads)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        tokens = self.tokenizer.infer({"text": list(texts)})
        out = self.model.infer(tokens)
        return np.asarray(next(iter(out.values())))
