"""The compact embedding head: a linear projection learned from the indexed embeddings.

``fit_head(embeddings, dim)`` learns a PCA projection *without centering* (the top right-singular
vectors of the embedding matrix): it is the rank-``dim`` linear map that best preserves the
embeddings in the least-squares sense, hence their inner products, which is what retrieval
ranks by. Index vectors and queries go through the same matrix (``apply``). ``dim`` equal to the
encoder's width gives the identity head (no projection). The head is stored next to the index
as ``head.npz`` (arrays only, never a pickle) and named by the SHA-256 of its arrays.

A PCA head also carries :class:`~usg.index.residual.ResidualCodes` for the directions it leaves
out (unless fitted with ``refine=False``): each indexed vector stores those as a few bytes, and
search re-ranks the graph's candidates with them (see usg.index.residual).
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, UsageError
from usg.index.residual import ResidualCodes, fit_residual

__all__ = ["Head", "fit_head"]

Array = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class Head:
    """``kind`` "pca" (``matrix`` is ``[in_dim, out_dim]``) or "identity" (``matrix`` is None)."""

    kind: str
    in_dim: int
    out_dim: int
    matrix: Array | None = None
    explained: float = 1.0  # fraction of the fitted embeddings' energy the projection keeps
    residual: ResidualCodes | None = None  # codes of what the projection leaves out, for re-ranking

    @property
    def digest(self) -> str:
        h = hashlib.sha256(f"{self.kind}:{self.in_dim}:{self.out_dim}".encode())
        arrays = [self.matrix]
        if self.residual is not None:
            r = self.residual
            h.update(f":residual:{r.n8}".encode())
            arrays += [r.matrix, r.lo, r.step]
        for a in arrays:
            if a is not None:
                h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
        return h.hexdigest()

    @property
    def code_bytes(self) -> int:
        """Bytes of residual code per indexed vector (0 without residual codes)."""
        return self.residual.code_bytes if self.residual is not None else 0

    def codes(self, embeddings: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """``[n, code_bytes]`` residual codes of ``[n, in_dim]`` embeddings (``[n, 0]`` without)."""
        x = np.atleast_2d(np.asarray(embeddings, dtype=np.float32))
        if self.residual is None:
            return np.zeros((len(x), 0), np.uint8)
        return self.residual.encode(x)

    def apply(self, embeddings: np.ndarray[Any, Any]) -> Array:
        x = np.asarray(embeddings, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.in_dim:
            raise InputError(
                f"embedding of shape {list(x.shape)} given to a head for {self.in_dim}-d encoder output",
                field="embedding",
                fix=f"embed with the encoder the index was built with ({self.in_dim}-d)",
            )
        if self.matrix is None:
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(x @ self.matrix)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "explained": round(self.explained, 6),
            "residual": self.residual.describe() if self.residual is not None else None,
            "digest": self.digest,
        }

    def save(self, path: Path) -> None:
        matrix = self.matrix if self.matrix is not None else np.zeros((0, 0), np.float32)
        arrays: dict[str, Any] = {
            "kind": np.array(self.kind),
            "in_dim": np.array(self.in_dim),
            "out_dim": np.array(self.out_dim),
            "explained": np.array(self.explained),
            "matrix": matrix,
        }
        if self.residual is not None:
            r = self.residual
            arrays |= {"res_matrix": r.matrix, "res_lo": r.lo, "res_step": r.step, "res_n8": np.array(r.n8)}
        with path.open("wb") as fh:
            np.savez(fh, **arrays)

    @classmethod
    def load(cls, path: Path) -> Head:
        """The head saved at ``path``; a missing or damaged file is a UsageError naming it."""
        try:
            with path.open("rb") as fh, np.load(fh, allow_pickle=False) as z:
                kind = str(z["kind"])
                in_dim, out_dim = int(z["in_dim"]), int(z["out_dim"])
                matrix = z["matrix"].astype(np.float32) if kind != "identity" else None
                residual = None
                if "res_matrix" in z.files:
                    residual = ResidualCodes(
                        z["res_matrix"].astype(np.float32),
                        z["res_lo"].astype(np.float32),
                        z["res_step"].astype(np.float32),
                        int(z["res_n8"]),
                    )
                explained = float(z["explained"])
        except (OSError, ValueError, KeyError, TypeError, EOFError, MemoryError, zipfile.BadZipFile) as exc:
            raise UsageError(
                f"{path}: not a usg index head ({type(exc).__name__}: {exc}); "
                "fix: the index folder is damaged; rebuild it with usg index build DIR -o INDEX --force"
            ) from None
        if kind not in ("identity", "pca") or (matrix is not None and matrix.shape != (in_dim, out_dim)):
            shape = None if matrix is None else matrix.shape
            raise UsageError(
                f"{path}: head kind {kind!r} with a {shape} matrix for {in_dim}→{out_dim}; "
                "fix: the index folder is damaged; rebuild it with usg index build DIR -o INDEX --force"
            )
        return cls(kind, in_dim, out_dim, matrix, explained, residual)


def fit_head(embeddings: np.ndarray[Any, Any], dim: int, *, refine: bool = True) -> Head:
    """Learn a ``dim``-wide head from ``[n, d]`` embeddings (identity when ``dim == d``); with
    ``refine``, also the residual codes of the other ``d - dim`` directions (8 bits for the next
    ``dim`` of them, 4 bits for the rest)."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or not len(x):
        raise UsageError("a head is learned from embeddings; none were given; fix: index at least one line")
    n, d = x.shape
    if dim == d:
        return Head("identity", d, d)
    if not 1 <= dim < d:
        raise UsageError(f"--dim {dim}: the encoder emits {d}-d embeddings; fix: pass --dim between 1 and {d}")
    if n < dim:
        raise UsageError(
            f"--dim {dim}: a {dim}-d head is learned from the indexed lines, and there are only {n}; "
            f"fix: index at least {dim} lines, or pass --dim {d} (no head)"
        )
    # right-singular vectors of X via the d×d Gram matrix (X may have millions of rows)
    gram = (x.T.astype(np.float64)) @ x.astype(np.float64)
    values, vectors = np.linalg.eigh(gram)
    order = np.argsort(values)[::-1]
    top = order[:dim]
    matrix = vectors[:, top].astype(np.float32)
    explained = float(values[top].sum() / max(values.sum(), 1e-12))
    residual = fit_residual(x, vectors[:, order[dim:]], n8=dim) if refine else None
    return Head("pca", d, dim, matrix, explained, residual)
