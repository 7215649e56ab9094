"""What `usg quantize` buys on this CPU: FP32 vs quantized, measured in the same run.

    python benchmarks/quantize.py [--part minilm|document|both] [--sentences 600] [--methods dynamic,static]
                                  [--concurrency 16] [--duration 15] [--max-trials 6]

- ``minilm``: the example graph's MiniLM quantized by :func:`usg.quantize.quantize_graph`
  (``--method dynamic``, and ``static``), then FP32 and INT8 sessions embed the same
  ``--sentences`` real English sentences (standard-library docstrings) at batch 8 (padded to a
  multiple of 8 per batch, as the graph's batcher pads), alternating, ``--rounds`` times: items/s
  (best round each) and mean / min cosine against FP32. Target: ≥ 1.8× at mean cosine ≥ 0.995.
- ``document``: det and rec quantized static on rendered documents, then the whole graph at
  ``--concurrency`` closed-loop clients, FP32 and INT8 alternating: requests/s, and character
  accuracy of the OCR lines against the rendered text for both. Target: ≥ 1.3×, accuracy within
  0.5 points.

Prints whether the CPU has VNNI (int8 dot products): without it (AVX2 only) ONNX Runtime's int8
kernels widen through 16-bit sums and the speed-up is smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from usg.bench.samples import Sample
from usg.graph import load_graph
from usg.quantize import QuantizeConfig, QuantSettings, parse_guard, quantize_graph
from usg.quantize.corpus import english_sentences
from usg.quantize.methods import has_vnni

GRAPH = "examples/document_ocr/graph.yaml"


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _batches(graph: Any, sentences: list[str], size: int) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(graph.models["tokenizer"].path))
    out = []
    for i in range(0, len(sentences), size):
        enc = [tok.encode(s).ids[:256] for s in sentences[i : i + size]]
        width = -(-max(len(e) for e in enc) // 8) * 8
        ids = np.zeros((len(enc), width), np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(enc):
            ids[r, : len(e)] = e
            mask[r, : len(e)] = 1
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    return out


def _embed(session: Any, batches: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    embs = [session.run(None, b)[0] for b in batches]
    return np.concatenate(embs), time.perf_counter() - t0


def minilm(args: argparse.Namespace, work: Path) -> None:
    graph = load_graph(GRAPH, export_missing=True)
    sentences = english_sentences(args.sentences + 80)
    guard_texts, bench_texts = sentences[:80], sentences[80:]
    samples = [Sample(f"t{i}", text=t) for i, t in enumerate(guard_texts)]
    batches = _batches(graph, bench_texts, 8)
    threads = int(graph.models["minilm"].options.get("intra_op_threads") or 2)
    fp32 = _session(graph.models["minilm"].path, threads)
    for method in args.methods.split(","):
        config = QuantizeConfig(
            ("minilm",), QuantSettings(method), guards=(parse_guard("text_embedding:cosine>=0.995"),), max_trials=8
        )
        result = quantize_graph(graph, samples, config, work / method, log=lambda m: print("  ", m))
        o = result.outcomes["minilm"]
        if o.path is None:
            print(f"minilm {method}: the guard did not hold; stays FP32")
            continue
        int8 = _session(o.path, threads)
        ref, _ = _embed(fp32, batches[:2])  # warm-up both
        _embed(int8, batches[:2])
        best = {"fp32": float("inf"), "int8": float("inf")}
        for rnd in range(args.rounds):
            for name, sess in (("fp32", fp32), ("int8", int8)) if rnd % 2 == 0 else (("int8", int8), ("fp32", fp32)):
                emb, seconds = _embed(sess, batches)
                best[name] = min(best[name], seconds)
                if name == "fp32":
                    ref = emb
                else:
                    got = emb
        cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        n = len(bench_texts)
        print(
            f"minilm {method}: {n} sentences at batch 8, {threads} threads: FP32 {n / best['fp32']:.1f} items/s, "
            f"INT8 {n / best['int8']:.1f} items/s, ×{best['fp32'] / best['int8']:.2f}; cosine vs FP32 mean "
            f"{cos.mean():.4f} min {cos.min():.4f}; {len(o.settings.exclude_nodes)} node(s) kept FP32; "
            f"{o.size_mb['fp32']:.1f} → {o.size_mb.get('quantized', 0):.1f} MB"
        )


def _documents() -> list[tuple[Sample, list[str]]]:
    from usg.bench.samples import default_samples
    from usg.testing.documents import Line, render_document

    extra = [
        ["Meeting notes March 14", "Budget approved for Q3", "Next review on Monday"],
        ["Customer ID 889210", "Delivery window 9am to 5pm", "Contact support for changes"],
        ["Warehouse inventory list", "Pallets received 48", "Damaged items 3"],
        ["Flight AB 2207 to Oslo", "Boarding at gate 12", "Seat 14C window"],
    ]
    from usg.bench.samples import _DEFAULT_DOCS

    out = [(s, [t for t, *_ in doc]) for s, doc in zip(default_samples(), _DEFAULT_DOCS, strict=True)]
    for i, lines in enumerate(extra):
        img = render_document([Line(t, size=26 - 2 * (j % 2)) for j, t in enumerate(lines)])
        out.append((Sample(f"extra{i}", img), lines))
    return out


def _char_accuracy(graph: Any, docs: list[tuple[Sample, list[str]]]) -> float:
    from usg.quantize.guard import char_accuracy
    from usg.quantize.runner import run_outputs

    outs = run_outputs(graph, [s for s, _ in docs])
    refs = ["\n".join(truth) for _, truth in docs]
    hyps = ["\n".join(line["text"] for line in (o.get("lines") or [])) for o in outs]
    return char_accuracy(refs, hyps)


async def _load(graph: Any, samples: list[Sample], args: argparse.Namespace, name: str) -> Any:
    from usg.bench.loadgen import run_closed
    from usg.bench.samples import sample_cycle
    from usg.bench.targets import InProcessTarget

    target = InProcessTarget(graph, name=name)
    await target.start()
    try:
        return await run_closed(
            target, sample_cycle(samples), concurrency=args.concurrency, duration_s=args.duration, warmup_s=args.warmup
        )
    finally:
        await target.aclose()


def document(args: argparse.Namespace, work: Path) -> None:
    graph = load_graph(GRAPH, export_missing=True)
    docs = _documents()
    guards = tuple(parse_guard(g) for g in args.doc_guard)
    config = QuantizeConfig(("det", "rec"), QuantSettings("static"), guards=guards, max_trials=args.max_trials)
    result = quantize_graph(graph, [s for s, _ in docs], config, work / "doc", log=lambda m: print("  ", m))
    for name, o in result.outcomes.items():
        print(f"{name}: {'quantized' if o.path else 'stays FP32'}; {len(o.settings.exclude_nodes)} node(s) kept FP32")
    if not any(o.path for o in result.outcomes.values()):
        print("document: no model could be quantized within the guard")
        return
    quant = result.quantized_graph()
    acc = {"fp32": _char_accuracy(graph, docs), "int8": _char_accuracy(quant, docs)}
    samples = [s for s, _ in docs]
    runs: dict[str, list[Any]] = {"fp32": [], "int8": []}
    for rnd in range(args.rounds):
        order = ("fp32", "int8") if rnd % 2 == 0 else ("int8", "fp32")
        for name in order:
            runs[name].append(asyncio.run(_load(graph if name == "fp32" else quant, samples, args, name)))
    thr = {k: sum(r.completed for r in v) / sum(r.duration_s for r in v) for k, v in runs.items()}
    points = 100 * (acc["int8"] - acc["fp32"])
    print(
        f"document graph, {'+'.join(n for n, o in result.outcomes.items() if o.path)} INT8, "
        f"{args.concurrency} clients: FP32 {thr['fp32']:.2f} req/s, "
        f"INT8 {thr['int8']:.2f} req/s, ×{thr['int8'] / thr['fp32']:.2f}; character accuracy vs rendered text "
        f"FP32 {100 * acc['fp32']:.2f}%, INT8 {100 * acc['int8']:.2f}% ({points:+.2f} points)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["minilm", "document", "both"], default="both")
    p.add_argument("--sentences", type=int, default=600)
    p.add_argument("--methods", default="dynamic,static", help="MiniLM: the methods to compare with FP32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=15)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument(
        "--doc-guard", action="append", default=[], help="document part: guards (default: one per output by type)"
    )
    args = p.parse_args()
    print(f"VNNI on this CPU: {'yes' if has_vnni() else 'no (AVX2 int8 kernels only)'}")
    with tempfile.TemporaryDirectory(prefix="usg-quant-bench-") as d:
        if args.part in ("minilm", "both"):
            minilm(args, Path(d))
        if args.part in ("document", "both"):
            document(args, Path(d))


if __name__ == "__main__":
    main()
