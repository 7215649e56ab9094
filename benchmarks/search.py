"""Document-search benchmark: the compact head and the vector-index libraries on real text.

Corpus: ``--lines N`` docstring lines of the installed Python code (see search_corpus.py: the
standard library first, then site-packages), embedded once with the document graph's MiniLM and
cached under ``--cache``. Queries: ``--queries Q`` *other* lines (the last Q of the shuffled
list, never in the corpus). Ground truth: exact inner-product top-10 over the 384-d float32
embeddings (numpy), measured in the same run. Printed:

* recall@10 against that ground truth of exact search in the head's space, for several head
  widths (which width reaches 98%);
* for USearch (f16, f32), hnswlib and faiss-cpu HNSW on the 128-d head vectors (and USearch on
  the 384-d vectors): recall@10, build time, query p50/p95 (one query at a time), footprint;
* the product path: ``usg.index`` building a shard from the embeddings (head fit + adds, lines/s),
  ``DocumentIndex.search`` p95, and text queries end to end (MiniLM through the executor + search);
* embedding throughput of the graph's encoder (lines/s), i.e. what ``usg index build`` costs per line.

    python benchmarks/search.py --lines 100000 --queries 1000
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import onnxruntime  # noqa: E402, F401  (before usearch: USearch 2.26 imported first crashes onnxruntime)
from search_corpus import cached_embeddings, docstring_lines  # noqa: E402

K = 10
GRAPH = HERE.parent / "examples" / "document_ocr" / "graph.yaml"


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    out = np.empty((len(queries), k), dtype=np.int64)
    for s in range(0, len(queries), 256):
        sims = queries[s : s + 256] @ base.T
        part = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[s : s + 256] = np.take_along_axis(part, order, axis=1)
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size


def timed_queries(
    search_one: Callable[[np.ndarray], np.ndarray], queries: np.ndarray
) -> tuple[np.ndarray, list[float]]:
    found, ms = [], []
    for q in queries:
        t0 = time.perf_counter()
        found.append(search_one(q))
        ms.append((time.perf_counter() - t0) * 1000)
    return np.asarray(found), ms


def p(ms: list[float], q: float) -> float:
    return float(np.percentile(ms, q))


# -- libraries ----------------------------------------------------------------------------------
def lib_usearch(base: np.ndarray, dtype: str) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    from usearch.index import Index

    idx = Index(
        ndim=base.shape[1],
        metric="ip",
        dtype=dtype,
        connectivity=16,
        expansion_add=128,
        expansion_search=64,
    )
    idx.add(np.arange(len(base), dtype=np.uint64), base)
    return (lambda q: np.asarray(idx.search(q, K, threads=1).keys, dtype=np.int64)), int(idx.serialized_length)


def lib_hnswlib(base: np.ndarray) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    import hnswlib

    idx = hnswlib.Index(space="ip", dim=base.shape[1])
    idx.init_index(max_elements=len(base), ef_construction=128, M=16)
    idx.add_items(base, np.arange(len(base)))
    idx.set_ef(64)
    idx.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.bin"
        idx.save_index(str(path))
        size = path.stat().st_size
    return (lambda q: idx.knn_query(q, k=K)[0][0].astype(np.int64)), size


def lib_faiss(base: np.ndarray, sq: bool) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    import faiss

    faiss.omp_set_num_threads(1)
    d = base.shape[1]
    if sq:
        idx = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, 16, faiss.METRIC_INNER_PRODUCT)
        idx.train(base)
    else:
        idx = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
    idx.hnsw.efConstruction = 128
    idx.add(base)
    idx.hnsw.efSearch = 64
    size = len(faiss.serialize_index(idx))
    return (lambda q: idx.search(q[None, :], K)[1][0].astype(np.int64)), size


def compare_libraries(
    proj: np.ndarray,
    base384: np.ndarray,
    queries_proj: np.ndarray,
    queries384: np.ndarray,
    truth: np.ndarray,
    flat384: int,
) -> None:
    rows = [
        ("usearch f16", lambda: lib_usearch(proj, "f16"), queries_proj),
        ("usearch f32", lambda: lib_usearch(proj, "f32"), queries_proj),
        ("hnswlib f32 (M=16)", lambda: lib_hnswlib(proj), queries_proj),
        ("faiss HNSWFlat f32 (M=16)", lambda: lib_faiss(proj, sq=False), queries_proj),
        ("faiss HNSWSQ fp16 (M=16, chosen)", lambda: lib_faiss(proj, sq=True), queries_proj),
        ("usearch i8 (M=16)", lambda: lib_usearch(proj, "i8"), queries_proj),
        ("usearch f32, 384-d, no head", lambda: lib_usearch(base384, "f32"), queries384),
        ("usearch f16, 384-d, no head", lambda: lib_usearch(base384, "f16"), queries384),
        ("usearch i8, 384-d, no head", lambda: lib_usearch(base384, "i8"), queries384),
    ]
    print(
        f"\nANN libraries, HNSW (M/connectivity 16, ef_construction 128, ef_search 64), "
        f"{proj.shape[1]}-d head vectors unless said; one query at a time"
    )
    print(
        f"{'library':32s} {'recall@10':>9s} {'build s':>8s} {'p50 ms':>7s} {'p95 ms':>7s} "
        f"{'MiB':>7s} {'vs 384-d f32':>12s}"
    )
    for name, make, qs in rows:
        gc.collect()
        t0 = time.perf_counter()
        search_one, size = make()
        build_s = time.perf_counter() - t0
        for q in qs[:50]:
            search_one(q)  # warm-up
        found, ms = timed_queries(search_one, qs)
        print(
            f"{name:32s} {recall(found, truth):9.2%} {build_s:8.1f} {p(ms, 50):7.3f} {p(ms, 95):7.3f} "
            f"{size / 2**20:7.1f} {size / flat384:12.1%}"
        )


# -- the product path ---------------------------------------------------------------------------
def product_path(
    lines: list[str],
    base384: np.ndarray,
    queries384: np.ndarray,
    qlines: list[str],
    truth: np.ndarray,
    dim: int,
    flat384: int,
) -> None:
    """``usg.index`` with residual re-ranking (the default) and without (``--no-refine``)."""
    for refine in (True, False):
        product_variant(lines, base384, queries384, qlines, truth, dim, flat384, refine)


def head_bytes(head) -> int:
    arrays = [head.matrix]
    if head.residual is not None:
        arrays += [head.residual.matrix, head.residual.lo, head.residual.step]
    return sum(a.nbytes for a in arrays if a is not None)


def product_variant(
    lines: list[str],
    base384: np.ndarray,
    queries384: np.ndarray,
    qlines: list[str],
    truth: np.ndarray,
    dim: int,
    flat384: int,
    refine: bool,
) -> None:
    from usg.graph import load_graph
    from usg.index.encoder import file_digest, find_text_encoder, query_graph
    from usg.index.head import fit_head
    from usg.index.query import Searcher
    from usg.index.store import DocumentIndex
    from usg.runtime import Executor

    graph = load_graph(GRAPH, export_missing=True)
    chain = find_text_encoder(graph)
    digest = file_digest(chain.encoder_path(graph))
    t0 = time.perf_counter()
    head = fit_head(base384, dim, refine=refine)
    fit_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        idx = DocumentIndex.create(
            Path(tmp) / "idx",
            head=head,
            encoder_digest=digest,
            encoder_path=str(chain.encoder_path(graph)),
            graph_path=str(GRAPH),
        )
        shard = idx.shard("stdlib", create=True)
        t0 = time.perf_counter()
        step = 10_000
        for s in range(0, len(lines), step):  # one "document" per 10 000 lines
            chunk = slice(s, s + step)
            shard.add_document(
                f"part{s // step:03d}.txt",
                "-",
                "text",
                lines[chunk],
                [None] * len(lines[chunk]),
                head.apply(base384[chunk]),
                None,
                head.codes(base384[chunk]),
            )
        add_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        idx.save()
        save_s = time.perf_counter() - t0
        disk = sum(f.stat().st_size for f in (Path(tmp) / "idx").rglob("*") if f.is_file())
        vec_bytes = shard.lines.nbytes + head_bytes(head)
        t0 = time.perf_counter()
        idx = DocumentIndex.open(Path(tmp) / "idx")
        open_s = time.perf_counter() - t0
        found, ms, cpu = [], [], []
        for q in queries384:
            t0, c0 = time.perf_counter(), time.thread_time()
            hits = idx.search(q, encoder_digest=digest, k=K)
            ms.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
            found.append(hits)
        # map hits back to corpus rows through their text (lines are distinct)
        row = {t: i for i, t in enumerate(lines)}
        found_rows = np.asarray([[row[h.text] for h in hs] for hs in found])
        codes = (
            f"re-ranked by {head.code_bytes} B/vector of residual codes ({head.residual.describe()['bits']} bits)"
            if head.residual is not None
            else "no re-ranking (--no-refine)"
        )
        print(
            f"\nusg.index at {len(lines)} lines, head {head.kind} {head.in_dim}→{head.out_dim} "
            f"(keeps {head.explained:.1%} of the energy), {codes}:"
        )
        print(
            f"  build from embeddings: head fit {fit_s:.1f} s, adds {add_s:.1f} s "
            f"({len(lines) / add_s:.0f} lines/s), save {save_s:.1f} s; open {open_s:.1f} s"
        )
        print(
            f"  vectors + links + codes + head: {vec_bytes / 2**20:.1f} MiB = {vec_bytes / flat384:.1%} of the "
            f"384-d float32 vectors ({flat384 / 2**20:.1f} MiB); whole folder with texts {disk / 2**20:.1f} MiB"
        )
        print(
            f"  DocumentIndex.search: recall@10 {recall(found_rows, truth):.2%}, "
            f"p50 {p(ms, 50):.2f} ms, p95 {p(ms, 95):.2f} ms; CPU time of the searching thread "
            f"p50 {p(cpu, 50):.2f} ms, p95 {p(cpu, 95):.2f} ms (what a query costs without waiting for a core)"
        )
        if not refine:
            return
        sweep_candidates(idx, lines, queries384, truth, digest)
        searcher = Searcher(idx, graph)
        with Executor(query_graph(graph, chain)) as ex:
            ex.start_sync()

            e2e = []
            for text in qlines[:200]:
                t0 = time.perf_counter()
                searcher.search_text_sync(ex, text, k=K)
                e2e.append((time.perf_counter() - t0) * 1000)
        print(
            f"  text query end to end (MiniLM through the executor + search), 200 queries: "
            f"p50 {p(e2e, 50):.1f} ms, p95 {p(e2e, 95):.1f} ms"
        )


def sweep_candidates(idx, lines: list[str], queries384: np.ndarray, truth: np.ndarray, digest: str) -> None:
    """Recall and time against the number of graph neighbours re-ranked (usg.index.vectors.CANDIDATES)."""
    from usg.index import vectors

    saved = vectors.CANDIDATES, vectors.EF_REFINE
    row = {t: i for i, t in enumerate(lines)}
    print("  re-ranked candidates (graph ef = max(candidates, 500)):")
    try:
        for n in (50, 100, 200, 300, 500):
            vectors.CANDIDATES, vectors.EF_REFINE = n, max(n, 500)
            found, ms, cpu = [], [], []
            for q in queries384:
                t0, c0 = time.perf_counter(), time.thread_time()
                hits = idx.search(q, encoder_digest=digest, k=K)
                ms.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.thread_time() - c0) * 1000)
                found.append([row[h.text] for h in hits])
            mark = "  <- default" if n == saved[0] else ""
            print(
                f"    {n:4d}: recall@10 {recall(np.asarray(found), truth):.2%}, "
                f"p50 {p(ms, 50):.2f} ms, p95 {p(ms, 95):.2f} ms; CPU p50 {p(cpu, 50):.2f} ms, "
                f"p95 {p(cpu, 95):.2f} ms{mark}"
            )
    finally:
        vectors.CANDIDATES, vectors.EF_REFINE = saved


def embedding_throughput(sample: list[str]) -> None:
    from usg.graph import load_graph
    from usg.index.encoder import LineEncoder

    with LineEncoder(load_graph(GRAPH, export_missing=True)) as enc:
        enc.encode(sample[:64])
        t0 = time.perf_counter()
        enc.encode(sample)
        secs = time.perf_counter() - t0
    print(
        f"\nembedding (the graph's MiniLM through the executor, {len(sample)} lines, sorted by length, "
        f"batched): {len(sample) / secs:.0f} lines/s ({secs / len(sample) * 1000:.2f} ms/line); "
        f"usg index build of text is bounded by this"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dims", default="64,128,192,256,288,320,352", help="head widths for the recall sweep")
    ap.add_argument("--cache", type=Path, default=Path("/work/cache/search"))
    ap.add_argument(
        "--parts",
        default="sweep,libraries,product,embedding",
        help="what to run: sweep (head widths), libraries (ANN comparison), product (usg.index), embedding",
    )
    args = ap.parse_args()

    all_lines, n_std = docstring_lines(args.cache)
    if args.lines + args.queries > len(all_lines):
        sys.exit(f"--lines + --queries must be ≤ {len(all_lines)}")
    print(
        f"corpus: {len(all_lines)} distinct docstring lines ({n_std} from the standard library); "
        f"indexing {args.lines}, querying with {args.queries} others"
    )
    t0 = time.perf_counter()
    base = cached_embeddings(all_lines, args.lines, args.cache, GRAPH, print)
    qlines = all_lines[-args.queries :]
    queries = cached_embeddings_queries(qlines, args.cache)
    print(f"embeddings ready in {time.perf_counter() - t0:.0f} s (cached under {args.cache})")
    lines = all_lines[: args.lines]
    flat384 = base.nbytes

    truth = exact_topk(base, queries)
    parts = set(args.parts.split(","))
    from usg.index.head import fit_head

    if "sweep" in parts:
        print(f"\nexact search in the head's space vs exact 384-d (recall@10, {args.queries} queries):")
        for d in [int(x) for x in args.dims.split(",")]:
            h = fit_head(base, d)
            r = recall(exact_topk(h.apply(base), h.apply(queries)), truth)
            print(f"  dim {d:4d}: recall@10 {r:.2%}  (energy kept {h.explained:.1%})")
    head = fit_head(base, args.dim)
    if "libraries" in parts:
        compare_libraries(head.apply(base), base, head.apply(queries), queries, truth, flat384)
    if "product" in parts:
        product_path(lines, base, queries, qlines, truth, args.dim, flat384)
    if "embedding" in parts:
        embedding_throughput(all_lines[args.lines : args.lines + 2000])


def cached_embeddings_queries(qlines: list[str], cache: Path) -> np.ndarray:
    import hashlib

    from usg.graph import load_graph
    from usg.index.encoder import LineEncoder

    key = hashlib.sha256("\n".join(qlines).encode()).hexdigest()[:12]
    f = cache / f"queries-{key}.npy"
    if f.is_file():
        return np.load(f)
    with LineEncoder(load_graph(GRAPH, export_missing=True)) as enc:
        arr = enc.encode(qlines)
    np.save(f, arr)
    return arr


if __name__ == "__main__":
    main()
