"""One collection's shard: its documents, their lines (text, box) and two vector sets.

A shard folder holds ``lines.vectors.npz`` (one vector per line), ``pages.vectors.npz`` (one vector per
document: the embedding of its whole text, which image queries search) and ``meta.json``
(documents with their input's SHA-256 and keys; per line its document, text and box). Shards
are independent: a collection is added to, removed from, rebuilt or dropped without touching
the others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.index.vectors import VectorSet

__all__ = ["DocumentRecord", "Shard"]


@dataclass
class DocumentRecord:
    """What a shard keeps of one document."""

    doc_id: str
    sha256: str
    kind: str  # "image" | "text"
    line_keys: list[int] = field(default_factory=list)
    page_key: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "kind": self.kind, "line_keys": self.line_keys, "page_key": self.page_key}

    @classmethod
    def from_json(cls, doc_id: str, d: dict[str, Any]) -> DocumentRecord:
        return cls(doc_id, str(d["sha256"]), str(d["kind"]), [int(k) for k in d["line_keys"]], d.get("page_key"))


class Shard:
    """A collection's documents and vectors; ``save`` writes its folder atomically per file."""

    def __init__(self, name: str, dim: int, code_bytes: int = 0) -> None:
        self.name = name
        self.dim = dim
        self.code_bytes = code_bytes
        self.lines = VectorSet(dim, code_bytes)
        self.pages = VectorSet(dim, code_bytes)
        self.documents: dict[str, DocumentRecord] = {}
        self.entries: dict[int, tuple[str, str, list[list[float]] | None]] = {}  # key -> (doc, text, box)
        self.next_key = 0
        self._page_owner: dict[int, str] | None = None  # page key -> document, rebuilt after changes

    def __len__(self) -> int:
        return len(self.entries)

    def add_document(
        self,
        doc_id: str,
        sha256: str,
        kind: str,
        texts: Sequence[str],
        boxes: Sequence[list[list[float]] | None],
        line_vectors: np.ndarray[Any, Any],
        page_vector: np.ndarray[Any, Any] | None,
        line_codes: np.ndarray[Any, Any] | None = None,
        page_codes: np.ndarray[Any, Any] | None = None,
    ) -> DocumentRecord:
        """Add (or replace) a document: its lines with their projected vectors (and residual codes, when
        the shard keeps them), and its page vector."""
        if len(texts) != len(boxes) or len(texts) != len(line_vectors):
            raise InputError(
                f"document {doc_id!r}: {len(texts)} lines, {len(boxes)} boxes, {len(line_vectors)} vectors",
                field="lines",
                fix="pass one box (or None) and one vector per line",
            )
        if doc_id in self.documents:
            self.remove_document(doc_id)
        keys = list(range(self.next_key, self.next_key + len(texts)))
        self.next_key += len(texts)
        self.lines.add(np.asarray(keys, dtype=np.int64), line_vectors, line_codes)
        for key, text, box in zip(keys, texts, boxes, strict=True):
            self.entries[key] = (doc_id, text, box)
        rec = DocumentRecord(doc_id, sha256, kind, keys)
        if page_vector is not None:
            rec.page_key = self.next_key
            self.next_key += 1
            self.pages.add(np.asarray([rec.page_key], dtype=np.int64), page_vector, page_codes)
        self.documents[doc_id] = rec
        self._page_owner = None
        return rec

    def remove_document(self, doc_id: str) -> DocumentRecord:
        rec = self.documents.pop(doc_id, None)
        if rec is None:
            raise KeyError(doc_id)
        self._page_owner = None
        self.lines.remove(np.asarray(rec.line_keys, dtype=np.int64))
        for key in rec.line_keys:
            self.entries.pop(key, None)
        if rec.page_key is not None:
            self.pages.remove(np.asarray([rec.page_key], dtype=np.int64))
        return rec

    def page_owner(self, key: int) -> str | None:
        if self._page_owner is None:
            self._page_owner = {r.page_key: d for d, r in self.documents.items() if r.page_key is not None}
        return self._page_owner.get(key)

    # -- disk ---------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.lines.save(folder / "lines.vectors.npz")
        self.pages.save(folder / "pages.vectors.npz")
        meta = {
            "name": self.name,
            "dim": self.dim,
            "next_key": self.next_key,
            "documents": {d: r.to_json() for d, r in sorted(self.documents.items())},
            "lines": [[k, *v] for k, v in sorted(self.entries.items())],
        }
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, folder / "meta.json")

    @classmethod
    def load(cls, folder: Path, dim: int, code_bytes: int = 0) -> Shard:
        meta_path = folder / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(
                f"shard {folder.name!r}: cannot read {meta_path} ({exc})",
                field=str(meta_path),
                fix=f"the shard is damaged; remove the collection (rm -r {folder}) and add its documents again",
            ) from None
        damaged = f"the shard is damaged; remove the collection (rm -r {folder}) and add its documents again"
        try:
            shard = cls(str(meta["name"]), dim, code_bytes)
            shard.next_key = int(meta["next_key"])
            shard.documents = {str(d): DocumentRecord.from_json(str(d), r) for d, r in meta["documents"].items()}
            shard.entries = {int(k): (str(doc), str(text), box) for k, doc, text, box in meta["lines"]}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(
                f"shard {folder.name!r}: {meta_path} does not hold a shard ({type(exc).__name__}: {exc})",
                field=str(meta_path),
                fix=damaged,
            ) from None
        for vs_name in ("lines", "pages"):
            path = folder / f"{vs_name}.vectors.npz"
            if not path.is_file():
                raise InputError(
                    f"shard {folder.name!r}: {path.name} is missing",
                    field=str(path),
                    fix=f"the shard is damaged; remove the collection (rm -r {folder}) and add its documents again",
                )
            setattr(shard, vs_name, VectorSet.load(path, dim, code_bytes))
        return shard
