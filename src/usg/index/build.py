"""Build an index from a folder, add documents to it, remove them.

Images go through the document graph (OCR: lines with text and box; the page embedding is the
graph's embedding of the page's OCR text); ``.txt`` files are read line by line (the page
embedding is the embedding of the whole text, as the graph computes it for a page). Every line
is embedded by the graph's own tokenizer and encoder (:class:`usg.index.encoder.LineEncoder`),
many lines per request. ``build_index`` learns the compact head from all the lines it indexes;
``add_documents`` projects new lines with the head the index already has.

A document that cannot be read (not UTF-8, a truncated or oversized image, a text file past
:data:`MAX_TEXT_BYTES`, a page the OCR times out on) is skipped with its reason in
``unreadable`` and the rest are indexed: one bad scan in ten thousand does not cost the hours of
OCR before it. ``strict=True`` raises at the first one instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, RequestTimeout, UsageError
from usg.graph import Graph
from usg.index.encoder import LineEncoder, file_digest, find_text_encoder
from usg.index.head import Head, fit_head
from usg.index.store import DocumentIndex, check_collection_name
from usg.runtime import Executor

__all__ = [
    "IMAGE_SUFFIXES",
    "AddReport",
    "InputFile",
    "Unreadable",
    "add_documents",
    "build_index",
    "remove_documents",
    "scan_inputs",
]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp"})
AUTO_DIM = 128
MIN_LINES_PER_DIM = 8  # "auto" learns a 128-d head only from at least 8 × 128 lines
MAX_TEXT_BYTES = 64 * 2**20
#: a .txt line longer than this is indexed as several entries, cut at spaces: the encoder reads ~256
#: tokens of a line (a few hundred words; fewer for CJK text), so the rest of a long paragraph would
#: be invisible to search, and every hit would carry the whole paragraph back
MAX_LINE_CHARS = 600

Progress = Callable[[str, int], None]  # (document id, lines read) after each document


@dataclass(frozen=True)
class InputFile:
    doc_id: str
    path: Path
    kind: str  # "image" | "text"
    sha256: str


@dataclass
class ReadDocument:
    input: InputFile
    texts: list[str]
    boxes: list[list[list[float]] | None]
    embeddings: np.ndarray[Any, Any]  # [n, encoder dim]
    page: np.ndarray[Any, Any] | None  # [1, encoder dim]


@dataclass(frozen=True)
class Unreadable:
    """A document left out of the index, and why (the error's message, with its fix)."""

    doc_id: str
    reason: str


@dataclass
class AddReport:
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    lines: int = 0
    skipped: list[str] = field(default_factory=list)  # files of other types
    unreadable: list[Unreadable] = field(default_factory=list)  # not added (an old version, if any, stays)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def scan_inputs(paths: Sequence[str | Path]) -> tuple[list[InputFile], list[str]]:
    """Images and ``.txt`` files in ``paths`` (folders walked recursively); and the files skipped.

    A document's id is its path relative to the folder given (or its file name when a file is given).
    """
    found: list[InputFile] = []
    skipped: list[str] = []
    for raw in paths:
        root = Path(raw)
        if not root.exists():
            raise UsageError(f"{root} does not exist; fix: pass a folder of images / .txt files, or such files")
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for f in files:
            suffix = f.suffix.lower()
            kind = "image" if suffix in IMAGE_SUFFIXES else "text" if suffix == ".txt" else None
            if kind is None:
                skipped.append(str(f))
                continue
            doc_id = f.relative_to(root).as_posix() if root.is_dir() else f.name
            found.append(InputFile(doc_id, f, kind, _sha256(f)))
    ids = [f.doc_id for f in found]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise UsageError(f"document id(s) {dupes} given twice; fix: pass each document once")
    return found, skipped


class DocumentReader:
    """Reads documents into lines and embeddings with one graph (OCR executor started on first image)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.chain = find_text_encoder(graph)
        self.encoder = LineEncoder(graph)
        self._ocr: Executor | None = None

    def close(self) -> None:
        self.encoder.close()
        if self._ocr is not None:
            self._ocr.close()

    def _ocr_lines(self, f: InputFile) -> tuple[list[str], list[Any], np.ndarray[Any, Any] | None]:
        chain = self.chain
        if chain.image_input is None or chain.lines_output is None:
            raise UsageError(
                f"{f.path}: graph {self.graph.name!r} has no image input with an OCR lines output; "
                "fix: index images with a document graph (examples/document_ocr/graph.yaml)"
            )
        if self._ocr is None:
            self._ocr = Executor(self.graph, timeout_s=300.0)
        result = self._ocr.infer_sync({chain.image_input: f.path})
        lines = result.outputs.get(chain.lines_output) or []
        page = result.outputs.get(chain.page_output) if chain.page_output else None
        return [str(ln["text"]) for ln in lines], [ln.get("box") for ln in lines], page

    def read(self, f: InputFile) -> ReadDocument:
        if f.kind == "image":
            texts, boxes, page = self._ocr_lines(f)
            emb = self.encoder.encode(texts)
            if page is None and texts:
                page = self.encoder.encode(["\n".join(texts)])
        else:
            if f.path.stat().st_size > MAX_TEXT_BYTES:
                raise InputError(
                    f"{f.path} is {f.path.stat().st_size / 2**20:.0f} MiB; the limit for one text file is "
                    f"{MAX_TEXT_BYTES // 2**20} MiB",
                    field=str(f.path),
                    fix="split it into several files",
                )
            try:
                content = f.path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{f.path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    field=str(f.path),
                    fix="convert it to UTF-8 (iconv -t utf-8) or leave it out",
                ) from None
            texts = [piece for line in content.splitlines() for piece in line_pieces(" ".join(line.split()))]
            boxes = [None] * len(texts)
            both = (
                self.encoder.encode([*texts, "\n".join(texts)])
                if texts
                else np.zeros((0, self.encoder.dim), np.float32)
            )
            emb, page = both[: len(texts)], (both[len(texts) :] if texts else None)
        return ReadDocument(f, texts, list(boxes), emb, None if page is None else np.asarray(page).reshape(1, -1))

    def read_all(
        self, files: Sequence[InputFile], progress: Progress | None, unreadable: list[Unreadable] | None = None
    ) -> Iterator[ReadDocument]:
        """Each document read; with ``unreadable`` given, one that cannot be read is noted there and
        skipped (without it, its error is raised)."""
        for f in files:
            try:
                doc = self.read(f)
            except (InputError, RequestTimeout) as exc:  # this document's fault: not the graph's nor the index's
                if unreadable is None:
                    raise
                unreadable.append(Unreadable(f.doc_id, str(exc)))
                if progress is not None:
                    progress(f.doc_id, 0)
                continue
            if progress is not None:
                progress(f.doc_id, len(doc.texts))
            yield doc


def line_pieces(text: str, limit: int = MAX_LINE_CHARS) -> list[str]:
    """``text`` (whitespace already collapsed) in pieces of at most ``limit`` characters, cut at the
    last space before the limit (mid-word only where a piece has no space); empty text: none. Walks
    an index (cutting the rest off each time copied it: a 32 MB line took a minute)."""
    pieces: list[str] = []
    start, end = 0, len(text)
    while end - start > limit:
        cut = text.rfind(" ", start, start + limit + 1)
        if cut <= start:
            pieces.append(text[start : start + limit])
            start += limit
        else:
            pieces.append(text[start:cut])
            start = cut + 1
    if start < end:
        pieces.append(text[start:])
    return pieces


def _add(index: DocumentIndex, collection: str, doc: ReadDocument, head: Head) -> None:
    shard = index.shard(collection, create=True)
    page = head.apply(doc.page) if doc.page is not None else None
    page_codes = head.codes(doc.page) if doc.page is not None else None
    emb = doc.embeddings if len(doc.texts) else np.zeros((0, head.in_dim), np.float32)
    vectors = head.apply(emb) if len(emb) else np.zeros((0, head.out_dim), np.float32)
    codes = head.codes(emb) if len(emb) else np.zeros((0, head.code_bytes), np.uint8)
    shard.add_document(
        doc.input.doc_id, doc.input.sha256, doc.input.kind, doc.texts, doc.boxes, vectors, page, codes, page_codes
    )


def build_index(
    graph: Graph,
    files: Sequence[InputFile],
    out: Path,
    *,
    collection: str,
    dim: int | None = None,
    refine: bool = True,
    progress: Progress | None = None,
    note: Callable[[str], None] | None = None,
    unreadable: list[Unreadable] | None = None,
) -> DocumentIndex:
    """Read ``files``, learn the head from all their lines (``dim`` None: 128 when there are enough
    lines, else no head; ``refine``: with residual codes for re-ranking), and write a new index at ``out``.
    ``unreadable``: a list to collect documents that cannot be read (skipped); None raises at the first."""
    check_collection_name(collection)
    reader = DocumentReader(graph)
    try:
        docs = list(reader.read_all(files, progress, unreadable))
    finally:
        reader.close()
    all_emb = [d.embeddings for d in docs if len(d.texts)]
    if not all_emb:
        bad = (
            f"; {len(unreadable)} of {len(files)} could not be read, e.g. {unreadable[0].reason}" if unreadable else ""
        )
        raise UsageError(
            f"no lines were read from the inputs (blank pages or empty files{bad}); fix: index documents with text"
        )
    stacked = np.concatenate(all_emb, axis=0)
    enc_dim = stacked.shape[1]
    if dim is None:
        dim = AUTO_DIM if len(stacked) >= AUTO_DIM * MIN_LINES_PER_DIM else enc_dim
        if dim == enc_dim and note is not None:
            note(
                f"{len(stacked)} lines are too few to learn a {AUTO_DIM}-d head (auto needs "
                f"{AUTO_DIM * MIN_LINES_PER_DIM}); the index keeps the encoder's {enc_dim}-d vectors"
            )
    head = fit_head(stacked, dim, refine=refine)
    enc_path = reader.chain.encoder_path(graph)
    index = DocumentIndex.create(
        out,
        head=head,
        encoder_digest=file_digest(enc_path),
        encoder_path=str(enc_path),
        graph_path=str(graph.source) if graph.source else None,
    )
    for doc in docs:
        _add(index, collection, doc, head)
    index.save()
    return index


def add_documents(
    index: DocumentIndex,
    graph: Graph,
    files: Sequence[InputFile],
    *,
    collection: str,
    progress: Progress | None = None,
    strict: bool = False,
) -> AddReport:
    """Add new documents, replace changed ones (same id, other SHA-256), skip unchanged; then save.
    A document that cannot be read goes to ``report.unreadable`` (``strict``: raised instead)."""
    enc_path = find_text_encoder(graph).encoder_path(graph)
    index.check_encoder(file_digest(enc_path))
    shard = index.shards.get(collection)
    report = AddReport()
    todo = []
    for f in files:
        old = shard.documents.get(f.doc_id) if shard is not None else None
        if old is not None and old.sha256 == f.sha256:
            report.unchanged.append(f.doc_id)
            if progress is not None:
                progress(f.doc_id, 0)
        else:
            (report.replaced if old is not None else report.added).append(f.doc_id)
            todo.append(f)
    if todo:
        check_collection_name(collection)
        reader = DocumentReader(graph)
        try:
            for doc in reader.read_all(todo, progress, None if strict else report.unreadable):
                _add(index, collection, doc, index.head)
                report.lines += len(doc.texts)
        finally:
            reader.close()
        left_out = {u.doc_id for u in report.unreadable}
        report.added = [d for d in report.added if d not in left_out]
        report.replaced = [d for d in report.replaced if d not in left_out]
        index.save()
    return report


def remove_documents(index: DocumentIndex, doc_ids: Sequence[str], *, collection: str) -> list[str]:
    """Remove documents by id from a collection (UsageError naming unknown ids); then save."""
    shard = index.shard(collection)
    unknown = [d for d in doc_ids if d not in shard.documents]
    if unknown:
        known = sorted(shard.documents)
        # `usg search` prints a hit's document as COLLECTION/ID: the id a reader copies from it
        prefixed = [
            d for d in unknown if d.startswith(f"{collection}/") and d[len(collection) + 1 :] in shard.documents
        ]
        hint = (
            f"drop the collection prefix `usg search` prints ({prefixed[0][len(collection) + 1 :]!r}); or "
            if prefixed
            else ""
        )
        raise UsageError(
            f"collection {collection!r} has no document(s) {unknown}; fix: {hint}use ids as indexed, e.g. "
            f"{known[:5]}{' …' if len(known) > 5 else ''} (`usg index info INDEX --documents` lists them)"
        )
    for d in doc_ids:
        shard.remove_document(d)
    if not shard.documents:
        index.drop_collection(collection)
    index.save()
    return list(doc_ids)
