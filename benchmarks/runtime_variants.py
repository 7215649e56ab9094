"""What `usg tune` and backend settings change for USG on this machine: alternating runs, same process.

    python benchmarks/runtime_variants.py [--concurrency 16] [--duration 15] [--rounds 2]

Variants of the document-OCR graph, run in process at the same closed-loop load:
- ``untuned``: examples/document_ocr/graph.yaml as written;
- ``untuned-no-spin``: the same, with ONNX Runtime's intra-op threads not spin-waiting
  (``session.intra_op.allow_spinning=0``; not a backend option yet, patched here) — spinning
  matters when sessions with 2 intra-op threads share 2 cores;
- ``tuned``: with the ``usg tune`` sidecar (graph.tuned.yaml) applied.
Prints throughput and latency per variant and the ratio to ``untuned``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from usg.bench.loadgen import LoadResult, run_closed
from usg.bench.samples import default_samples, sample_cycle
from usg.bench.targets import InProcessTarget
from usg.bench.tune import apply_sidecar
from usg.graph import load_graph

GRAPH = "examples/document_ocr/graph.yaml"


@contextlib.contextmanager
def no_spin() -> Iterator[None]:
    import onnxruntime as ort

    original = ort.SessionOptions

    class Patched(original):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.add_session_config_entry("session.inter_op.allow_spinning", "0")

    ort.SessionOptions = Patched
    try:
        yield
    finally:
        ort.SessionOptions = original


async def run(variant: str, graph: Any, args: argparse.Namespace) -> LoadResult:
    ctx = no_spin() if variant.endswith("no-spin") else contextlib.nullcontext()
    with ctx:
        target = InProcessTarget(graph, name=variant)
        await target.start()
    try:
        return await run_closed(
            target,
            sample_cycle(default_samples()),
            concurrency=args.concurrency,
            duration_s=args.duration,
            warmup_s=args.warmup,
        )
    finally:
        await target.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=15)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    plain = load_graph(GRAPH, export_missing=True)
    graphs = {"untuned": plain, "untuned-no-spin": plain, "tuned": apply_sidecar(plain)}
    variants = list(graphs)
    results: dict[str, list[LoadResult]] = {v: [] for v in variants}
    for rnd in range(args.rounds):
        for v in variants if rnd % 2 == 0 else variants[::-1]:
            results[v].append(asyncio.run(run(v, graphs[v], args)))
    base = sum(r.completed for r in results["untuned"]) / sum(r.duration_s for r in results["untuned"])
    for v, rs in results.items():
        lat = [x for r in rs for x in r.latencies_ms]
        thr = sum(r.completed for r in rs) / sum(r.duration_s for r in rs)
        pooled = LoadResult(v, "closed", args.concurrency, None, 1.0, lat)
        print(
            f"{v:<16} {thr:6.2f} req/s  p50 {pooled.p(50):7.0f} ms  p95 {pooled.p(95):7.0f} ms  "
            f"×{thr / base:.2f} vs untuned"
        )


if __name__ == "__main__":
    main()
