"""Cost of live drift + health monitoring: serving p50 with and without ``--reference``, same run.

Starts two ``usg serve`` processes of the bundled document-OCR graph (a copy with a ``monitor:``
section watching both embeddings): one plain, one with ``--reference`` (a profile built here from
the load's own samples). Then alternates closed-loop rounds (A, B, A, B, …) at ``--concurrency``
clients against each and prints p50 / p95 / throughput per round and the ratio monitored / plain.
Only one server is loaded at a time; the other idles.

    python benchmarks/monitor_cost.py --concurrency 16 --duration 20 --rounds 3 [--workload text]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "document_ocr" / "graph.yaml"
MONITOR_SECTION = """
monitor:
  window: {size: 200}
  outputs:
    text_embedding: {kind: embedding}
    ocr_embedding: {kind: embedding}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(graph: Path, args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    usg = Path(sys.executable).parent / "usg"
    cmd = [str(usg), "serve", str(graph), "--port", str(port), "--log-level", "warning", *args]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"usg serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"usg serve not ready after 180 s:\n{log.read_text()[-3000:]}")


def _samples(workload: str) -> list[Any]:
    from usg.bench.samples import Sample, default_samples

    samples = default_samples()
    if workload == "text":
        return [Sample(f"t{i}", text=f"{s.text} {i}") for i, s in enumerate(samples * 8) if s.text]
    return samples


def _reference(graph_path: Path, samples: list[Any], folder: Path) -> Path:
    from PIL import Image

    from usg.graph import load_graph
    from usg.monitor.profile import build_profile, write_profile

    inputs = folder / "inputs"
    inputs.mkdir()
    for i, s in enumerate(samples * 3):
        if s.image is not None:
            Image.fromarray(s.image).save(inputs / f"s{i:03d}.png")
        if s.text is not None:
            (inputs / f"s{i:03d}.txt").write_text(s.text)
    ref = folder / "ref.json"
    write_profile(build_profile(load_graph(graph_path, export_missing=True), inputs), ref)
    return ref


def _hook_cost(graph_path: Path, ref: Path, samples: list[Any], n: int = 200, reps: int = 5) -> dict[str, float]:
    """In-process: the monitor's event-loop hooks per request, its worker per observation, one evaluation."""
    import logging

    import numpy as np

    from usg.graph import load_graph
    from usg.monitor.live import LiveMonitor
    from usg.monitor.profile import load_profile

    logging.getLogger("usg.monitor").setLevel(logging.ERROR)  # random embeddings drift: no warnings here
    graph = load_graph(graph_path)
    monitor = LiveMonitor(graph, load_profile(ref))
    rng = np.random.default_rng(0)
    hooks, work = [], []
    for _ in range(reps):
        batch = []
        for i in range(n):
            s = samples[i % len(samples)]
            values = dict(s.inputs())
            nodes = {"text_emb": {"embedding": rng.normal(size=(1, 384)).astype(np.float32)}}
            if "image" in values:
                nodes["ocr_emb"] = {"embedding": rng.normal(size=(1, 384)).astype(np.float32)}
            batch.append((f"r{i}", values, nodes))
        t0 = time.perf_counter()
        for rid, values, nodes in batch:
            monitor.request_values(rid, values, nodes)
            monitor.request_finished(rid, sorted(values), 0.3, "ok", [])
        hooks.append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        monitor.process_pending()  # a full window: includes its evaluation
        work.append((time.perf_counter() - t0) / n)
    t0 = time.perf_counter()
    monitor.evaluate()
    return {
        "hooks_us_per_request": statistics.median(hooks) * 1e6,
        "worker_ms_per_request": statistics.median(work) * 1e3,
        "evaluation_ms": (time.perf_counter() - t0) * 1e3,
        "window": float(n),
    }


async def _round(url: str, name: str, samples: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    from usg.bench.loadgen import run_closed
    from usg.bench.samples import sample_cycle
    from usg.bench.targets import UrlTarget

    target = UrlTarget(url, name=name)
    await target.start()
    try:
        res = await run_closed(
            target, sample_cycle(samples), concurrency=args.concurrency, duration_s=args.duration, warmup_s=args.warmup
        )
    finally:
        await target.aclose()
    return res.summary()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per round and server")
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workload", choices=["document", "text"], default="document")
    ap.add_argument("--json", action="store_true", help="print every round as JSON at the end")
    args = ap.parse_args()
    os.environ.setdefault("USG_CACHE", str(Path.home() / ".cache" / "usg"))
    samples = _samples(args.workload)
    folder = Path(tempfile.mkdtemp(prefix="usg-monitor-cost-"))  # kept: the server logs are in it
    graph = folder / "graph.yaml"
    graph.write_text(EXAMPLE.read_text() + MONITOR_SECTION)
    print(f"building the reference profile from {len(samples) * 3} sample requests ...", flush=True)
    ref = _reference(graph, samples, folder)
    plain, plain_url = _start(graph, [], folder / "plain.log")
    monitored, mon_url = _start(graph, ["--reference", str(ref)], folder / "monitored.log")
    rows: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            order = [("plain", plain_url), ("monitored", mon_url)]
            if r % 2:
                order.reverse()  # alternate who goes first, so a load trend on the box does not favour one
            for name, url in order:
                s = asyncio.run(_round(url, name, samples, args))
                s["round"] = r
                rows.append(s)
                print(
                    f"round {r} {name:9s} p50 {s['p50_ms']:8.1f} ms  p95 {s['p95_ms']:8.1f} ms  "
                    f"{s['throughput_rps']:6.2f} req/s  ({s['completed']} requests, {s['errors']} errors)",
                    flush=True,
                )
        with urllib.request.urlopen(f"{mon_url}/v1/monitor", timeout=30) as resp:
            snap = json.loads(resp.read())
    finally:
        for proc in (plain, monitored):
            proc.terminate()
            proc.wait(timeout=60)
    print(f"server logs in {folder}")
    ratios = []
    for r in range(args.rounds):
        a = next(x for x in rows if x["round"] == r and x["system"] == "plain")
        b = next(x for x in rows if x["round"] == r and x["system"] == "monitored")
        ratios.append(b["p50_ms"] / a["p50_ms"])
    med = statistics.median(ratios)
    print(
        f"\np50 monitored / plain per round: {', '.join(f'{x:.3f}' for x in ratios)}; median {med:.3f} "
        f"({(med - 1) * 100:+.1f}%) at {args.concurrency} clients, workload {args.workload}"
    )
    print(
        f"monitor: {snap['window']['observed_total']} observed, {snap['window']['dropped']} dropped, "
        f"{snap['window']['evaluations']} windows evaluated, health {snap['health']['score']}"
    )
    for c in snap["health"]["components"]:
        print(
            f"  health {c['name']:17s} value {c['value']!s:9.9s} score {c['score']!s:9.9s} "
            f"weight {c['effective_weight']}"
        )
    errors = [e for x in rows for e in x.get("error_samples", [])]
    if errors:
        print("errors:", *errors[:5], sep="\n  ")
    cost = _hook_cost(graph, ref, samples)
    plain_rps = statistics.median(x["throughput_rps"] for x in rows if x["system"] == "plain")
    cpu_per_request_ms = 2 * 1e3 / plain_rps if plain_rps else float("nan")  # 2 cores busy in a closed loop
    print(
        f"in-process: hooks {cost['hooks_us_per_request']:.1f} µs per request on the event loop; worker "
        f"{cost['worker_ms_per_request']:.3f} ms per request (features + its share of a window evaluation, "
        f"{cost['evaluation_ms']:.0f} ms per {cost['window']:.0f}-request window) = "
        f"{cost['worker_ms_per_request'] / cpu_per_request_ms:.2%} of the {cpu_per_request_ms:.1f} ms of CPU "
        "one request costs the plain server (2 cores / its req/s)"
    )
    if args.json:
        print(json.dumps({"rounds": rows, "in_process": cost}, indent=1))


if __name__ == "__main__":
    main()
