"""A document index on disk: manifest, compact head, one shard per collection; search across shards.

Layout of an index folder::

    INDEX/manifest.json          format, encoder (ONNX SHA-256, path), graph, head, dims, library
    INDEX/head.npz               the learned projection (see usg.index.head)
    INDEX/shards/COLLECTION/     one shard per collection (see usg.index.shard)

Query embeddings carry the digest of the encoder that made them; an index built with another
encoder refuses them (:class:`EncoderMismatch`), since its vectors would not be comparable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, UsageError
from usg.index.head import Head
from usg.index.shard import Shard
from usg.index.vectors import library_version

__all__ = ["DocumentIndex", "EncoderMismatch", "SearchHit"]

FORMAT = "usg-index/1"
MAX_K = 1000
_COLLECTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # fullmatch: `$` also matches before a final newline


class EncoderMismatch(InputError):
    """A query embedding comes from another encoder than the one the index was built with."""

    status = 409
    reason = "encoder_mismatch"


@dataclass(frozen=True)
class SearchHit:
    """One result: a line of a document (``kind`` "line") or a whole document (``kind`` "page")."""

    collection: str
    document: str
    score: float
    kind: str = "line"
    text: str | None = None
    box: list[list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "document": self.document,
            "kind": self.kind,
            "text": self.text,
            "box": self.box,
            "score": round(self.score, 6),
        }


def check_collection_name(name: str) -> str:
    if not _COLLECTION.fullmatch(name):
        raise UsageError(
            f"collection name {name!r} is not allowed; fix: use letters, digits, '.', '_' or '-' "
            "(up to 64, starting with a letter or digit)"
        )
    return name


#: widest vectors an index may declare (the manifest is read before anything of that size is made)
MAX_DIM = 65536


def _manifest_problem_free(mpath: Path, manifest: dict[str, Any]) -> int:
    """The manifest's vector width, after checking every field :meth:`DocumentIndex.open` reads: a
    damaged or hand-edited manifest is a UsageError naming the field, never a crash or a path
    outside the index (collection names become folder names)."""

    def bad(field: str, why: str) -> UsageError:
        return UsageError(f"{mpath}: {field} {why}; fix: rebuild the index (usg index build DIR -o INDEX --force)")

    dim = manifest.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise bad("dim", f"is {dim!r}, not a vector width in 1..{MAX_DIM}")
    head = manifest.get("head")
    if not isinstance(head, dict) or not isinstance(head.get("digest"), str):
        raise bad("head", f"is {head!r}, not an object with the head's digest")
    encoder = manifest.get("encoder")
    if not isinstance(encoder, dict) or not isinstance(encoder.get("sha256"), str):
        raise bad("encoder", f"is {encoder!r}, not an object with the encoder's sha256")
    names = manifest.get("collections")
    if not isinstance(names, list):
        raise bad("collections", f"is {names!r}, not a list of collection names")
    for name in names:
        if not isinstance(name, str) or not _COLLECTION.fullmatch(name):
            raise bad("collections", f"holds {name!r}, not a collection name (letters, digits, '.', '_', '-')")
    return dim


class DocumentIndex:
    """An open index. Create with :meth:`create`, open with :meth:`open`, write back with :meth:`save`."""

    def __init__(self, path: Path, manifest: dict[str, Any], head: Head, shards: dict[str, Shard]) -> None:
        self.path = path
        self.manifest = manifest
        self.head = head
        self.shards = shards

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: Path, *, head: Head, encoder_digest: str, encoder_path: str, graph_path: str | None
    ) -> DocumentIndex:
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "library": library_version(),
            "encoder": {"sha256": encoder_digest, "path": encoder_path, "dim": head.in_dim},
            "graph": graph_path,
            "dim": head.out_dim,
            "head": head.describe(),
            "collections": [],
        }
        return cls(Path(path), manifest, head, {})

    @classmethod
    def open(cls, path: str | Path) -> DocumentIndex:
        p = Path(path)
        mpath = p / "manifest.json"
        if not mpath.is_file():
            raise UsageError(
                f"{p} is not a usg index (no manifest.json); fix: build one with `usg index build DIR -o {p}`"
            )
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise UsageError(f"{mpath} is not valid JSON ({exc}); fix: rebuild the index") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else f"a JSON {type(manifest).__name__}"
            raise UsageError(
                f"{p}: index format {found!r}, this usg reads {FORMAT!r}; fix: rebuild the index with this version"
            )
        dim = _manifest_problem_free(mpath, manifest)
        head = Head.load(p / "head.npz")
        if head.digest != manifest["head"]["digest"]:
            raise UsageError(
                f"{p}: head.npz (sha256 {head.digest[:12]}) is not the head the manifest records "
                f"({manifest['head']['digest'][:12]}); fix: rebuild the index"
            )
        if head.out_dim != dim:
            raise UsageError(f"{p}: head.npz makes {head.out_dim}-d vectors, the manifest says {dim}; fix: rebuild")
        shards = {name: Shard.load(p / "shards" / name, dim, head.code_bytes) for name in manifest["collections"]}
        return cls(p, manifest, head, shards)

    def save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.head.save(self.path / "head.npz")
        live = set(self.shards)
        for name, shard in self.shards.items():
            shard.save(self.path / "shards" / name)
        shards_dir = self.path / "shards"
        if shards_dir.is_dir():
            for child in shards_dir.iterdir():
                if child.is_dir() and child.name not in live:
                    shutil.rmtree(child)
        self.manifest["collections"] = sorted(self.shards)
        tmp = self.path / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2), encoding="utf-8")
        os.replace(tmp, self.path / "manifest.json")

    # -- contents -----------------------------------------------------------------------------
    @property
    def encoder_digest(self) -> str:
        return str(self.manifest["encoder"]["sha256"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def shard(self, collection: str, *, create: bool = False) -> Shard:
        if collection not in self.shards:
            if not create:
                raise UsageError(
                    f"index {self.path} has no collection {collection!r}; "
                    f"fix: use one of {sorted(self.shards) or '(none yet)'}"
                )
            self.shards[check_collection_name(collection)] = Shard(collection, self.dim, self.head.code_bytes)
        return self.shards[collection]

    def drop_collection(self, collection: str) -> None:
        self.shard(collection)
        del self.shards[collection]

    def stats(self) -> dict[str, Any]:
        return {
            "collections": {
                n: {"documents": len(s.documents), "lines": len(s), "bytes": s.lines.nbytes + s.pages.nbytes}
                for n, s in sorted(self.shards.items())
            },
            "dim": self.dim,
            "head": self.manifest["head"],
            "encoder": self.manifest["encoder"],
            "library": self.manifest["library"],
        }

    # -- search -------------------------------------------------------------------------------
    def check_encoder(self, digest: str) -> None:
        if digest != self.encoder_digest:
            raise EncoderMismatch(
                f"the query was embedded by encoder sha256 {digest[:12]}…, but index {self.path} was built "
                f"with encoder sha256 {self.encoder_digest[:12]}… ({self.manifest['encoder']['path']}); "
                "their vectors are not comparable",
                field="encoder",
                fix="query with the graph the index was built with, or rebuild the index with this graph "
                "(usg index build DIR -o INDEX --graph GRAPH)",
            )

    def search(
        self,
        embedding: np.ndarray[Any, Any],
        *,
        encoder_digest: str,
        k: int = 10,
        pages: bool = False,
        collections: list[str] | None = None,
    ) -> list[SearchHit]:
        """Top-``k`` lines (``pages``: documents) for one encoder ``embedding``, best first, across shards."""
        self.check_encoder(encoder_digest)
        if not 1 <= k <= MAX_K:
            raise InputError(f"k={k} is out of range", field="k", fix=f"ask for 1 to {MAX_K} results")
        names = collections if collections else sorted(self.shards)
        for name in names:
            self.shard(name)
        q = self.head.apply(embedding)
        if len(q) != 1:
            raise InputError(f"search takes one query embedding, got {len(q)}", field="embedding", fix="pass one")
        residual = self.head.residual
        refine = (residual, residual.project(np.atleast_2d(embedding))) if residual is not None else None
        hits: list[SearchHit] = []
        for name in names:
            shard = self.shards[name]
            keys, scores = (shard.pages if pages else shard.lines).search(q, k, refine)
            for key, score in zip(keys[0].tolist(), scores[0].tolist(), strict=True):
                if key < 0:
                    continue
                if pages:
                    owner = shard.page_owner(key)
                    if owner is not None:
                        hits.append(SearchHit(name, owner, score, "page"))
                elif key in shard.entries:
                    doc, text, box = shard.entries[key]
                    hits.append(SearchHit(name, doc, score, "line", text, box))
        hits.sort(key=lambda h: -h.score)
        return hits[:k]
