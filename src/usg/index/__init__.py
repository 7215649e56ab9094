"""Document search: index OCR'd pages and text files, answer text (and image) queries.

``usg index build DIR -o INDEX`` reads images through a document graph (OCR lines and boxes)
and ``.txt`` files line by line, embeds every line with the graph's own text encoder, learns a
compact head (PCA to 128-d by default) and stores the vectors in faiss HNSW indexes (fp16), one
shard per collection. ``usg search INDEX "query"`` and ``POST /v1/search`` return the closest
lines with their document, text, box and score::

    from usg.index import DocumentIndex, Searcher
"""

from usg.index.build import (
    AddReport,
    InputFile,
    Unreadable,
    add_documents,
    build_index,
    remove_documents,
    scan_inputs,
)
from usg.index.encoder import LineEncoder, file_digest, find_text_encoder
from usg.index.head import Head, fit_head
from usg.index.query import Searcher
from usg.index.store import DocumentIndex, EncoderMismatch, SearchHit

__all__ = [
    "AddReport",
    "DocumentIndex",
    "EncoderMismatch",
    "Head",
    "InputFile",
    "LineEncoder",
    "SearchHit",
    "Searcher",
    "Unreadable",
    "add_documents",
    "build_index",
    "file_digest",
    "find_text_encoder",
    "fit_head",
    "remove_documents",
    "scan_inputs",
]
