"""One on-disk approximate-nearest-neighbour set of vectors: a thin layer over faiss's HNSW index.

faiss-cpu was chosen over USearch and hnswlib by ``benchmarks/search.py`` (recall, query time and
footprint on the same MiniLM line embeddings; figures in benchmarks/README.md): its HNSW index
over half-precision codes (``IndexHNSWSQ``, fp16) has the same recall as float32 at about half
the bytes, and the shortest query-time tail of the three on a busy 2-core CPU (USearch hands each
search to a worker thread: a 30–40 ms p95 under load; hnswlib stores float32 only). faiss's HNSW
cannot delete in place, so removed keys are tombstones, skipped at search time by an ID selector,
and compacted away when a save finds more than a quarter of the set removed. Vectors are compared
by inner product (scores are cosine-like: the encoder L2-normalises, the head keeps inner products).

A set may also keep each vector's residual codes (``code_bytes`` per vector; see
usg.index.residual). A search given the query's residual then asks the graph for ``CANDIDATES``
neighbours (``EF_REFINE`` wide) and re-ranks them by head score + residual score.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, MissingDependency
from usg.index.residual import ResidualCodes

__all__ = ["VectorSet", "library_version"]

M = 16
EF_CONSTRUCTION = 128
EF_SEARCH = 64
CANDIDATES = 300  # graph neighbours re-ranked by residual codes (benchmarks/search.py: recall vs width)
EF_REFINE = 500
COMPACT_AT = 0.25


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise MissingDependency("faiss", "index", "usg index / usg search") from None
    return faiss


def library_version() -> str:
    return f"faiss-cpu {_faiss().__version__}"


def _new_index(dim: int) -> Any:
    faiss = _faiss()
    index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_fp16, M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.hnsw.efSearch = EF_SEARCH
    return index


class VectorSet:
    """Keys (int64) → ``dim``-d vectors, searched by inner product; saved as one ``.npz`` file."""

    def __init__(self, dim: int, code_bytes: int = 0) -> None:
        self.dim = dim
        self.code_bytes = code_bytes
        self._index = _new_index(dim)
        self._codes = np.zeros((0, code_bytes), dtype=np.uint8)  # residual codes, by position
        self._keys = np.zeros(0, dtype=np.int64)  # position in the faiss index -> key
        self._pos: dict[int, int] = {}  # live key -> position
        self._dead = np.zeros(0, dtype=bool)  # tombstones, by position

    def __len__(self) -> int:
        return len(self._pos)

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
        return np.ascontiguousarray(arr)

    def add(
        self, keys: np.ndarray[Any, Any], vectors: np.ndarray[Any, Any], codes: np.ndarray[Any, Any] | None = None
    ) -> None:
        arr = self._check(vectors, "vectors")
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        if len(k) != len(arr):
            raise InputError(
                f"vectors: {len(k)} keys for {len(arr)} vectors", field="keys", fix="pass one key per vector"
            )
        c = np.zeros((len(k), 0), np.uint8) if codes is None else np.asarray(codes, dtype=np.uint8)
        if c.shape != (len(k), self.code_bytes):
            raise InputError(
                f"codes: shape {list(c.shape)}, this set keeps {self.code_bytes} bytes of residual code per vector",
                field="codes",
                fix=f"pass [{len(k)}, {self.code_bytes}] codes (the head's codes() of the same embeddings)",
            )
        clash = [int(x) for x in k if int(x) in self._pos]
        if clash or len(set(k.tolist())) != len(k):
            raise InputError(f"keys {clash[:5] or 'repeated'} are already in the set", field="keys", fix="use new keys")
        if not len(k):
            return
        if not self._index.is_trained:
            self._index.train(arr)  # fp16 codes need no statistics; faiss still asks for the call
        start = int(self._index.ntotal)
        self._index.add(arr)
        self._codes = np.concatenate([self._codes, c])
        self._keys = np.concatenate([self._keys, k])
        self._dead = np.concatenate([self._dead, np.zeros(len(k), dtype=bool)])
        self._pos.update({int(key): start + i for i, key in enumerate(k.tolist())})

    def remove(self, keys: np.ndarray[Any, Any]) -> int:
        removed = 0
        for key in np.asarray(keys, dtype=np.int64).reshape(-1).tolist():
            pos = self._pos.pop(int(key), None)
            if pos is not None:
                self._dead[pos] = True
                removed += 1
        return removed

    def search(
        self,
        queries: np.ndarray[Any, Any],
        k: int,
        refine: tuple[ResidualCodes, np.ndarray[Any, Any]] | None = None,
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.float32]]]:
        """``(keys [q, k], scores [q, k])``, best first; score = inner product. Rows are padded with
        key -1 / score -inf when the set holds fewer than ``k`` vectors. ``refine`` (the head's
        residual codes and the queries' ``[q, r]`` residual coordinates) re-ranks a wider candidate
        list by head + residual score, when this set keeps codes."""
        faiss = _faiss()
        q = self._check(queries, "query")
        keys = np.full((len(q), k), -1, dtype=np.int64)
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        if len(self) == 0 or k == 0:
            return keys, scores
        refining = refine is not None and self.code_bytes > 0
        want = max(k, CANDIDATES) if refining else k
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(EF_REFINE if refining else EF_SEARCH, want)
        dead = np.flatnonzero(self._dead)
        if len(dead):
            batch = faiss.IDSelectorBatch(len(dead), faiss.swig_ptr(dead.astype(np.int64)))
            params.sel = faiss.IDSelectorNot(batch)
        faiss.omp_set_num_threads(1)  # this thread only: one query is ~0.1 ms, a thread team only adds tail
        dist, pos = self._index.search(q, min(want, len(self)), params=params)
        for row in range(len(q)):
            ok = pos[row] >= 0
            p, d = pos[row][ok], dist[row][ok]
            if refining and refine is not None and len(p):
                codes, residual = refine
                d = d + codes.scores(self._codes[p], np.atleast_2d(residual)[row])
                best = np.argsort(-d, kind="stable")[:k]
                p, d = p[best], d[best]
            n = min(k, len(p))
            keys[row, :n] = self._keys[p[:n]]
            scores[row, :n] = d[:n]
        return keys, scores

    @property
    def nbytes(self) -> int:
        """Bytes of the serialised faiss index (fp16 codes and graph links), the residual codes and the key map."""
        return len(_faiss().serialize_index(self._index)) + self._codes.nbytes + self._keys.nbytes + self._dead.nbytes

    def _compacted(self) -> VectorSet:
        live = np.flatnonzero(~self._dead)
        fresh = VectorSet(self.dim, self.code_bytes)
        if len(live):
            vectors = np.vstack([self._index.reconstruct(int(p)) for p in live]).astype(np.float32)
            fresh.add(self._keys[live], vectors, self._codes[live])
        return fresh

    def save(self, path: Path) -> None:
        current = self
        if len(self._dead) and self._dead.mean() > COMPACT_AT:
            current = self._compacted()
            self.__dict__.update(current.__dict__)
        blob = _faiss().serialize_index(current._index)
        buf = io.BytesIO()
        np.savez(buf, index=blob, keys=current._keys, dead=current._dead, dim=np.array(self.dim), codes=current._codes)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, dim: int, code_bytes: int = 0) -> VectorSet:
        faiss = _faiss()
        try:
            with path.open("rb") as fh, np.load(fh, allow_pickle=False) as z:
                blob, keys, dead, file_dim = z["index"], z["keys"], z["dead"], int(z["dim"])
                codes = z["codes"] if "codes" in z.files else np.zeros((len(keys), 0), np.uint8)
            index = faiss.deserialize_index(blob)
        except (OSError, ValueError, KeyError, RuntimeError, EOFError, MemoryError, zipfile.BadZipFile) as exc:
            raise InputError(
                f"{path}: not a vector set ({type(exc).__name__}: {exc})",
                field=str(path),
                fix="the index folder is damaged; rebuild it with usg index build",
            ) from None
        if file_dim != dim or index.d != dim:
            raise InputError(
                f"{path}: {index.d}-d vectors, the manifest says {dim}-d",
                field=str(path),
                fix="the index folder is damaged; rebuild it with usg index build",
            )
        if codes.shape != (len(keys), code_bytes):
            raise InputError(
                f"{path}: {codes.shape[1]} bytes of residual code per vector, the index's head makes {code_bytes}",
                field=str(path),
                fix="the index folder is damaged or from another build; rebuild it with usg index build",
            )
        out = cls(dim, code_bytes)
        out._codes = codes.astype(np.uint8)
        out._index = index
        out._index.hnsw.efSearch = EF_SEARCH
        out._keys = keys.astype(np.int64)
        out._dead = dead.astype(bool)
        out._pos = {int(key): i for i, key in enumerate(out._keys.tolist()) if not out._dead[i]}
        return out
