"""The search benchmark's corpus: every docstring line of the installed Python code, embedded once.

Lines come from the docstrings (module, class, function) of every ``.py`` file of the running
interpreter's standard library (about 36 000 distinct lines of three words or more) and then of
its site-packages (numpy, scipy, torch, transformers, ... — to reach hundreds of thousands of
lines), stripped, at least three words, deduplicated, in a fixed shuffled order (cached as a text
file). Embeddings are made with the document graph's own MiniLM (through ``usg.index``'s
``LineEncoder``: the executor, batched) and cached in chunks of 10 000 lines under ``--cache``
(keyed by the encoder's SHA-256), so a second run — or a run with more ``--lines`` — only embeds
what is missing, and an interrupted run resumes.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

CHUNK = 10_000


def _docstring_lines(path: Path) -> list[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            out.extend(" ".join(raw.split()) for raw in (doc or "").splitlines())
    return out


def docstring_lines(cache: Path, limit: int = 400_000) -> tuple[list[str], int]:
    """Up to ``limit`` distinct docstring lines (stdlib first, then site-packages), shuffled; and how many
    came from the standard library."""
    paths = sysconfig.get_paths()
    key = hashlib.sha256(f"{paths['stdlib']}|{paths['purelib']}|{limit}".encode()).hexdigest()[:12]
    cached = cache / f"docstring-lines-{key}.txt"
    if cached.is_file():
        head, *lines = cached.read_text(encoding="utf-8").split("\n")
        return lines, int(head)
    seen: set[str] = set()
    out: list[str] = []
    n_stdlib = 0
    for root in (Path(paths["stdlib"]), Path(paths["purelib"])):
        for path in sorted(root.rglob("*.py")):
            if root.name != "site-packages" and "site-packages" in path.parts:
                continue
            for line in _docstring_lines(path):
                if len(line.split()) >= 3 and line not in seen:
                    seen.add(line)
                    out.append(line)
            if len(out) >= limit:
                break
        if root.name != "site-packages":
            n_stdlib = len(out)
        if len(out) >= limit:
            break
    out = out[:limit]
    random.Random(0).shuffle(out)
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_text("\n".join([str(n_stdlib), *out]), encoding="utf-8")
    return out, n_stdlib


def cached_embeddings(
    lines: list[str], n: int, cache: Path, graph_path: Path, progress: Any = None
) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Embeddings of ``lines[:n]``, from the chunk cache, embedding (and caching) missing chunks."""
    from usg.graph import load_graph
    from usg.index.encoder import LineEncoder, file_digest, find_text_encoder

    graph = load_graph(graph_path, export_missing=True)
    digest = file_digest(find_text_encoder(graph).encoder_path(graph))
    corpus_id = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    folder = cache / f"stdlib-{corpus_id}-{digest[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    encoder: LineEncoder | None = None
    try:
        for c in range(-(-n // CHUNK)):
            f = folder / f"chunk{c:03d}.npy"
            chunk = lines[c * CHUNK : (c + 1) * CHUNK]
            if f.is_file():
                arr = np.load(f)
            else:
                if encoder is None:
                    encoder = LineEncoder(graph)
                t0 = time.perf_counter()
                arr = encoder.encode(chunk)
                np.save(f, arr)
                if progress is not None:
                    progress(f"embedded chunk {c} ({len(chunk)} lines) in {time.perf_counter() - t0:.0f} s")
            parts.append(arr)
    finally:
        if encoder is not None:
            encoder.close()
    return np.concatenate(parts)[:n]


if __name__ == "__main__":  # embed the cache ahead of the benchmark: python benchmarks/search_corpus.py N
    import sys

    here = Path(__file__).resolve().parents[1]
    all_lines, n_std = docstring_lines(Path("/work/cache/search"))
    print(f"{len(all_lines)} docstring lines ({n_std} from the standard library)")
    want = int(sys.argv[1]) if len(sys.argv) > 1 else len(all_lines)
    emb = cached_embeddings(
        all_lines,
        min(want, len(all_lines)),
        Path("/work/cache/search"),
        here / "examples/document_ocr/graph.yaml",
        print,
    )
    print(emb.shape)
