"""Issue #21 item 2: where the time goes when USG serves the document graph at 16 clients.

Runs the document graph (embedded engine, node cache off) under 16 closed-loop clients twice
under py-spy (``pip install py-spy``): once sampling every running thread (where the CPU
goes) and once with ``--gil`` (only the thread holding the GIL: what Python code serialises).
Samples are grouped by the innermost frame that names a stage — an ONNX Runtime session run
(det's, called by the direct runner, or a batched model's, called by the batch kernel), a graph
node function (``usg.ops.ocr``), the tokenizer, the executor on the event loop, or other. It also
prints the process's CPU time per request, its CPU use against the 2 cores, and the context
switches per request (thread oversubscription shows as involuntary switches).

Run: python benchmarks/profile_c16.py [--duration 20] [--clients 16] [--sidecar PATH]
(``--workload`` is the child process py-spy records; not for direct use.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

GRAPH = Path(__file__).parents[1] / "examples" / "document_ocr" / "graph.yaml"

FN_NODES = (
    "det_preprocess",
    "det_postprocess",
    "crop_lines",
    "cls_preprocess",
    "rec_preprocess",
    "ctc_decode",
)


def classify(stack: list[str]) -> str:
    """A py-spy stack (outermost first) → the stage it belongs to."""
    names = [f.split(" (")[0].rsplit(".", 1)[-1] for f in stack]  # "Session.run (file:line)" -> "run"
    files = [f.split(" (")[1] if " (" in f else "" for f in stack]
    if "run" in names and any("onnxruntime_inference_collection" in f for f in files):
        if "call_backend_cpu" in names or "assemble" in names:
            return "batched models cls/rec/minilm (ORT run)"
        return "det (ORT run)"
    for fn in FN_NODES:
        if fn in names:
            return f"node {fn}"
    if any("tokenizer" in f for f in files):
        return "tokenizer"
    if "assemble" in names or "split_outputs" in names:
        return "batch assemble/split (copies)"
    if any("/usg/" in f for f in files):
        return "executor (usg.runtime etc.)"
    if any("asyncio" in f for f in files):
        return "event loop (asyncio)"
    return "other"


def summarize(raw: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        counts[classify(stack.split(";"))] += int(n)
    return counts


async def workload(duration: float, clients: int, sidecar: Path | None) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from serving_speed import documents

    from usg.graph import load_graph
    from usg.graph.sidecar import apply_sidecar
    from usg.runtime import Executor

    graph = load_graph(GRAPH, export_missing=True)
    if sidecar is not None:
        graph = apply_sidecar(graph, sidecar)
    inputs = [{"image": d} for d in documents()]
    async with Executor(graph, timeout_s=900, cache=False) as ex:
        await asyncio.gather(*(ex.infer(i) for i in inputs))
        done = 0
        stop = time.perf_counter() + 5 + duration  # 5 s warm-up, then the measured window

        async def client(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < stop:
                await ex.infer(inputs[i % len(inputs)])
                if measuring:
                    done += 1
                i += clients

        measuring = False
        tasks = [asyncio.create_task(client(k)) for k in range(clients)]
        await asyncio.sleep(5)
        measuring = True
        t0, c0, sw0 = time.perf_counter(), os.times(), _switches()
        await asyncio.sleep(duration)
        t1, c1, sw1 = time.perf_counter(), os.times(), _switches()
        measuring = False
        await asyncio.gather(*tasks)
    wall = t1 - t0
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "requests": done,
        "req_s": done / wall,
        "cpu_ms_per_request": cpu * 1e3 / max(1, done),
        "cpu_use_of_cores": cpu / wall / (os.cpu_count() or 1),
        "involuntary_switches_per_request": (sw1[1] - sw0[1]) / max(1, done),
        "voluntary_switches_per_request": (sw1[0] - sw0[0]) / max(1, done),
        "threads": len(os.listdir("/proc/self/task")),
    }


def _switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of this process."""
    vol = inv = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                inv += int(line.split()[1])
    return vol, inv


def record(mode: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    raw = out / f"{mode}.txt"
    stats = out / f"{mode}.json"
    cmd = [
        "py-spy",
        "record",
        "--format",
        "raw",
        "--rate",
        "50",
        "--output",
        str(raw),
        *(["--gil"] if mode == "gil" else []),
        "--",
        sys.executable,
        __file__,
        "--workload",
        str(stats),
        "--duration",
        str(args.duration),
        "--clients",
        str(args.clients),
        *(["--sidecar", str(args.sidecar)] if args.sidecar else []),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(stats.read_text())
    result["samples"] = summarize(raw)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--sidecar", type=Path, default=None)
    ap.add_argument("--workload", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload is not None:
        res = asyncio.run(workload(args.duration, args.clients, args.sidecar))
        args.workload.write_text(json.dumps(res))
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: record(mode, args, Path(tmp)) for mode in ("cpu", "gil")}
    for mode, res in runs.items():
        total = sum(res["samples"].values()) or 1
        what = "running threads (CPU)" if mode == "cpu" else "the thread holding the GIL"
        print(f"\n{mode}: samples of {what}, {args.clients} clients, {args.duration:g} s measured")
        print(
            f"  {res['req_s']:.2f} req/s, process CPU {res['cpu_ms_per_request']:.0f} ms/request, "
            f"{100 * res['cpu_use_of_cores']:.0f}% of the cores, {res['threads']} threads, context switches per "
            f"request: {res['voluntary_switches_per_request']:.0f} voluntary, "
            f"{res['involuntary_switches_per_request']:.0f} involuntary"
        )
        for cat, n in res["samples"].most_common():
            print(f"  {cat:<44}{100 * n / total:6.1f}%")


if __name__ == "__main__":
    main()
