"""One on-disk approximate-nearest-neighbour set of vectors: a thin layer over USearch's HNSW index.

USearch was chosen over hnswlib and faiss-cpu by ``benchmarks/search.py`` (recall, query time and
footprint on the same 100 000 MiniLM line embeddings; figures in benchmarks/README.md): it stores
half-precision vectors (half the bytes at the same recall), removes keys in place, and saves and
restores a single file. Vectors are compared by inner product (scores are cosine-like: the encoder
L2-normalises, the head preserves inner products).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# USearch 2.26 (its numkong kernels) imported *before* onnxruntime makes onnxruntime's import crash
# the process (SIGSEGV); imported after it, both work. usg always has onnxruntime: load it first.
import onnxruntime  # noqa: F401

from usg.errors import InputError, MissingDependency

__all__ = ["VectorSet", "library_version"]

CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 64


def _usearch() -> Any:
    try:
        from usearch import index as usearch_index
    except ImportError:
        raise MissingDependency("usearch", "index", "usg index / usg search") from None
    return usearch_index


def library_version() -> str:
    _usearch()
    import usearch

    return f"usearch {usearch.__version__}"


class VectorSet:
    """Keys (int64) → ``dim``-d vectors, searched by inner product; saved as one ``.usearch`` file."""

    def __init__(self, dim: int, *, dtype: str = "f16", index: Any = None) -> None:
        self.dim = dim
        self.dtype = dtype
        self._index = index or _usearch().Index(
            ndim=dim,
            metric="ip",
            dtype=dtype,
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )

    def __len__(self) -> int:
        return len(self._index)

    def _check(self, vectors: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise InputError(
                f"{what}: vectors of shape {list(arr.shape)}, this index holds {self.dim}-d vectors",
                field=what,
                fix=f"pass [n, {self.dim}] float32 arrays (the index's head output)",
            )
        if not np.isfinite(arr).all():
            raise InputError(f"{what}: vectors contain NaN or inf", field=what, fix="embed the text again")
        return arr

    def add(self, keys: np.ndarray[Any, Any], vectors: np.ndarray[Any, Any]) -> None:
        arr = self._check(vectors, "vectors")
        k = np.asarray(keys, dtype=np.uint64)
        if len(k) != len(arr):
            raise InputError(
                f"vectors: {len(k)} keys for {len(arr)} vectors", field="keys", fix="pass one key per vector"
            )
        if len(k):
            self._index.add(k, arr)

    def remove(self, keys: np.ndarray[Any, Any]) -> int:
        k = np.asarray(keys, dtype=np.uint64)
        return int(self._index.remove(k)) if len(k) else 0

    def search(
        self, queries: np.ndarray[Any, Any], k: int
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.float32]]]:
        """``(keys [q, ≤k], scores [q, ≤k])``, best first; score = inner product. Rows are padded with
        key -1 / score -inf when the set holds fewer than ``k`` vectors."""
        q = self._check(queries, "query")
        keys = np.full((len(q), k), -1, dtype=np.int64)
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        if len(self) == 0 or k == 0:
            return keys, scores
        # one thread: a query is ~0.2 ms of work; USearch's default pool (every core) only adds tail latency
        m = self._index.search(q, min(k, len(self)), threads=1)
        found_keys = np.asarray(m.keys, dtype=np.int64).reshape(len(q), -1)
        dist = np.asarray(m.distances, dtype=np.float32).reshape(len(q), -1)
        counts = np.asarray(m.counts if hasattr(m, "counts") else [len(m.keys)]).reshape(-1)
        for row, n in enumerate(counts):
            keys[row, :n] = found_keys[row, :n]
            scores[row, :n] = 1.0 - dist[row, :n]  # USearch's "ip" distance is 1 - <q, x>
        return keys, scores

    @property
    def nbytes(self) -> int:
        """Bytes of the serialised index (vectors and graph links)."""
        return int(self._index.serialized_length)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        self._index.save(str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, dim: int, dtype: str = "f16") -> VectorSet:
        index = _usearch().Index.restore(str(path))
        if index is None or index.ndim != dim:
            got = "not a USearch file" if index is None else f"{index.ndim}-d"
            raise InputError(
                f"{path}: {got}, the manifest says {dim}-d",
                field=str(path),
                fix="the index folder is damaged; rebuild it with usg index build",
            )
        index.expansion_search = EXPANSION_SEARCH
        return cls(dim, dtype=dtype, index=index)
