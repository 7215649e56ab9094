"""Residual codes: what the compact head leaves out, kept in a few bits per component to re-rank.

The head projects onto the top ``dim`` principal directions of the indexed embeddings; the
approximate-nearest-neighbour graph searches in that space. The rest of each embedding — its
coordinates along the remaining principal directions, orthogonal to the head's — is stored as
scalar-quantized codes: 8 bits for the next ``dim`` components (they still hold most of what the
head misses), 4 bits for the remainder. A query's candidates from the graph are re-scored as
``head score + decode(codes) · query residual``; since the directions are orthonormal, that sum
approximates the encoder's own inner product, so the re-ranked top-k is close to exact search
in the encoder's full width. For MiniLM (384-d) with a 128-d head this is 192 bytes per vector
(figures in benchmarks/README.md).

Quantization is per component, uniform between the fitted embeddings' 0.05th and 99.95th
percentile; values outside clip. Codes are ``uint8``: one byte per 8-bit component, two 4-bit
components per byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ResidualCodes", "fit_residual"]

Array = np.ndarray[Any, np.dtype[np.float32]]
Codes = np.ndarray[Any, np.dtype[np.uint8]]

CLIP_PERCENTILE = 0.05


@dataclass(frozen=True)
class ResidualCodes:
    """``matrix`` [in_dim, r]: the residual directions; ``lo``/``step`` [r]: per-component quantizers;
    the first ``n8`` components take 8 bits, the others 4."""

    matrix: Array
    lo: Array
    step: Array
    n8: int

    @property
    def components(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def code_bytes(self) -> int:
        return self.n8 + (self.components - self.n8 + 1) // 2

    def describe(self) -> dict[str, Any]:
        n4 = self.components - self.n8
        return {"components": self.components, "bits": f"8x{self.n8}+4x{n4}", "bytes_per_vector": self.code_bytes}

    def project(self, x: np.ndarray[Any, Any]) -> Array:
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32) @ self.matrix)

    def encode(self, x: np.ndarray[Any, Any]) -> Codes:
        """``[n, in_dim]`` embeddings → ``[n, code_bytes]`` codes."""
        r = self.project(np.atleast_2d(x))
        levels = np.where(np.arange(self.components) < self.n8, 255, 15)
        q = np.clip(np.rint((r - self.lo) / self.step), 0, levels).astype(np.uint8)
        low, high = q[:, : self.n8], q[:, self.n8 :]
        if high.shape[1] % 2:
            high = np.concatenate([high, np.zeros((len(high), 1), np.uint8)], axis=1)
        packed = high[:, 0::2] | (high[:, 1::2] << 4)
        return np.ascontiguousarray(np.concatenate([low, packed], axis=1))

    def decode(self, codes: np.ndarray[Any, Any]) -> Array:
        """``[n, code_bytes]`` codes → ``[n, r]`` residual coordinates (dequantized)."""
        c = np.asarray(codes, dtype=np.uint8)
        packed = c[:, self.n8 :]
        high = np.empty((len(c), packed.shape[1] * 2), np.uint8)
        high[:, 0::2] = packed & 0x0F
        high[:, 1::2] = packed >> 4
        q = np.concatenate([c[:, : self.n8], high[:, : self.components - self.n8]], axis=1)
        return q.astype(np.float32) * self.step + self.lo

    def scores(self, codes: np.ndarray[Any, Any], query_residual: np.ndarray[Any, Any]) -> Array:
        """Residual inner products of stored ``codes`` with one query's residual coordinates."""
        return np.asarray(self.decode(codes) @ np.asarray(query_residual, np.float32).reshape(-1), np.float32)


def fit_residual(x: np.ndarray[Any, Any], directions: np.ndarray[Any, Any], n8: int) -> ResidualCodes:
    """Quantizers for ``x``'s coordinates along ``directions`` ([in_dim, r], orthonormal)."""
    matrix = np.ascontiguousarray(directions, dtype=np.float32)
    r = np.asarray(x, dtype=np.float32) @ matrix
    lo = np.percentile(r, CLIP_PERCENTILE, axis=0).astype(np.float32)
    hi = np.percentile(r, 100 - CLIP_PERCENTILE, axis=0).astype(np.float32)
    n8 = max(0, min(n8, matrix.shape[1]))
    levels = np.where(np.arange(matrix.shape[1]) < n8, 255, 15).astype(np.float32)
    step = (np.maximum(hi - lo, 1e-12) / levels).astype(np.float32)
    return ResidualCodes(matrix, lo, step, n8)
