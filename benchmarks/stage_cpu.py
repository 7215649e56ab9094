"""Issue #21 item 2: CPU time per document request, stage by stage (models vs Python nodes).

Each stage of the document graph is run on its own in this thread — the same ``usg.ops.ocr``
functions and single-threaded ONNX Runtime sessions the graph uses — and timed with the
thread's CPU clock (``time.thread_time``), so the figures hold on a CPU shared with other work
(wall time there swings 2x; a thread's CPU time barely moves). A request's cost is the sum of its
stages (rec and cls per crop, the way the graph calls them with the tuned batch size 1; MiniLM
on the OCR text and one query). Python nodes hold the GIL for most of their time (numpy and
OpenCV release it inside their C loops), so their share is what serialises on the event loop's
interpreter; the rest is model time.

Run: python benchmarks/stage_cpu.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from serving_speed import documents

from usg.backends import OnnxRuntimeBackend
from usg.backends.tokenizer import TokenizerBackend
from usg.graph import load_graph
from usg.graph.paths import resolve_path
from usg.ops import ocr

GRAPH = Path(__file__).parents[1] / "examples" / "document_ocr" / "graph.yaml"
VOCAB = "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"


def cpu_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.thread_time()
    out = fn()
    return (time.thread_time() - t0) * 1e3, out


def one_request(image: np.ndarray, be: dict[str, Any], costs: dict[str, list[float]]) -> None:
    def stage(name: str, fn: Callable[[], Any]) -> Any:
        ms, out = cpu_ms(fn)
        costs[name].append(ms)
        return out

    pre = stage("node det_preprocess", lambda: ocr.det_preprocess(image))
    prob = stage("model det", lambda: be["det"].infer({"x": pre["x"]}))
    (prob,) = prob.values()
    boxes = stage("node det_postprocess", lambda: ocr.det_postprocess(prob, pre["meta"]))["boxes"]
    crops = stage("node crop_lines", lambda: ocr.crop_lines(boxes, pre["meta"]))["items"]
    cls_in = stage("node cls_preprocess", lambda: ocr.cls_preprocess(crops))["items"]
    cls = stage("model cls", lambda: [next(iter(be["cls"].infer({"x": x}).values())) for x in cls_in])
    rec_in = stage("node rec_preprocess", lambda: ocr.rec_preprocess(crops, cls))["items"]
    rec = stage("model rec", lambda: [next(iter(be["rec"].infer({"x": x}).values())) for x in rec_in])
    text = stage("node ctc_decode", lambda: ocr.ctc_decode(rec, boxes, pre["meta"], vocab_model=VOCAB))["text"]
    for t in (text or "", "invoice total"):
        tok = stage("tokenizer", lambda t=t: be["tokenizer"].infer({"text": [t]}))
        stage("model minilm", lambda tok=tok: be["minilm"].infer(tok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    graph = load_graph(GRAPH, export_missing=True)
    be: dict[str, Any] = {}
    for name in ("det", "cls", "rec", "minilm"):
        path = resolve_path(graph.models[name].path, GRAPH.parent)
        be[name] = OnnxRuntimeBackend(path, {"intra_op_threads": 1}, name=name)
    tok = graph.models["tokenizer"]
    be["tokenizer"] = TokenizerBackend(resolve_path(tok.path, GRAPH.parent), tok.options)
    for b in be.values():
        b.load()
    docs = documents()
    costs: dict[str, list[float]] = defaultdict(list)
    one_request(docs[0], be, defaultdict(list))  # warm-up
    per_request: list[dict[str, float]] = []
    for _ in range(args.repeat):
        for d in docs:
            c: dict[str, list[float]] = defaultdict(list)
            one_request(d, be, c)
            per_request.append({k: sum(v) for k, v in c.items()})
    for k in per_request[0]:
        costs[k] = [r[k] for r in per_request]
    med = {k: statistics.median(v) for k, v in costs.items()}
    total = sum(med.values())
    print(f"CPU ms per document request (median over {len(per_request)} requests, one thread each stage)")
    print(f"{'stage':<24}{'CPU ms':>10}{'share':>8}")
    for k, v in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"{k:<24}{v:>10.2f}{100 * v / total:>7.1f}%")
    models = sum(v for k, v in med.items() if k.startswith("model"))
    python = sum(v for k, v in med.items() if k.startswith("node"))
    print(f"{'total':<24}{total:>10.2f}")
    share_m, share_p = 100 * models / total, 100 * python / total
    print(f"models {models:.1f} ms ({share_m:.1f}%), Python nodes {python:.1f} ms ({share_p:.1f}%)")
    print(f"CPU bound on 2 cores if nothing else ran: {2000 / total:.2f} req/s")


if __name__ == "__main__":
    main()
