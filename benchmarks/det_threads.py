"""Issue #21: det alone, threads per call against calls in flight, and how RapidOCR runs it.

The document graph's det (PP-OCRv4, ONNX Runtime) on ``usg bench``'s four default documents
(det inputs 1x3x736x2080 to 1x3x736x2528 float32), nothing else running in this process.
Each configuration runs for ``--seconds`` after one warm-up call per caller thread:

  1t x1       one session, 1 intra-op thread, one caller (USG's det options, spinning off)
  1t x2       the same session, two caller threads at once (the written graph's det: 1 thread,
              ``concurrency: 2``; in the pipeline the CPU gate lets at most 2 gated calls run)
  2t x1       one session, 2 intra-op threads, one caller (the tuned sidecar's det on 2 cores)
  rapidocr xN RapidOCR 1.4.4's own det session (``RapidOCR().text_det``: ORT's default
              intra-op threads, spinning on, no CPU memory arena) called from N threads at once,
              as ``usg bench``'s rapidocr baseline does from its thread pool (one worker a client)

Per configuration: calls/s over the window, mean wall time per call, process CPU per call
(``os.times``: every thread, ORT's pool included), the callers' own CPU per call
(``time.thread_time``) and the process's voluntary / involuntary context switches per call.
Rounds alternate the order of the configurations. No pass/fail.

Run: python benchmarks/det_threads.py [--seconds 8] [--rounds 2] [--config 1t-x1 --config ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import threading
import time
from typing import Any

import numpy as np

CONFIGS = ("1t-x1", "1t-x2", "2t-x1", "rapidocr-x1", "rapidocr-x2", "rapidocr-x4")


def _inputs() -> list[np.ndarray]:
    from usg.bench.samples import default_samples
    from usg.ops.ocr import det_preprocess

    return [np.ascontiguousarray(np.asarray(det_preprocess(s.image)["x"])).copy() for s in default_samples()]


def _usg_session(threads: int) -> Any:
    import onnxruntime as ort
    import rapidocr_onnxruntime

    path = os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models", "ch_PP-OCRv4_det_infer.onnx")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as usg.backends.onnxruntime
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def _rapidocr_session() -> Any:
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR().text_det.infer.session


def run(session: Any, xs: list[np.ndarray], callers: int, seconds: float) -> dict[str, float]:
    name = session.get_inputs()[0].name
    for x in xs[:callers]:  # warm-up, one call per caller's first input
        session.run(None, {name: x})
    walls: list[float] = []
    thread_cpu: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(callers + 1)
    stop_at = [0.0]

    def caller(k: int) -> None:
        start.wait()
        i = k
        c0 = time.thread_time()
        mine: list[float] = []
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            session.run(None, {name: xs[i % len(xs)]})
            mine.append(time.perf_counter() - t0)
            i += callers
        with lock:
            walls.extend(mine)
            thread_cpu.append(time.thread_time() - c0)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    p0 = os.times()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    p1 = os.times()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    n = len(walls)
    cpu = (p1.user + p1.system) - (p0.user + p0.system)
    return {
        "calls": n,
        "calls_per_s": n / elapsed,
        "wall_ms": 1000 * statistics.mean(walls),
        "cpu_ms": 1000 * cpu / n,
        "caller_cpu_ms": 1000 * sum(thread_cpu) / n,
        "vcsw": (r1.ru_nvcsw - r0.ru_nvcsw) / n,
        "ivcsw": (r1.ru_nivcsw - r0.ru_nivcsw) / n,
        "elapsed_s": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", action="append", choices=CONFIGS, help="repeatable; default: all")
    args = ap.parse_args()
    configs = args.config or list(CONFIGS)
    xs = _inputs()
    print("det inputs:", ", ".join("x".join(map(str, x.shape)) for x in xs))
    sessions: dict[str, Any] = {}
    for c in configs:
        if c.startswith("rapidocr"):
            sessions.setdefault("rapidocr", _rapidocr_session())
        else:
            sessions.setdefault(c[:2], _usg_session(int(c[0])))
    opts = sessions["rapidocr"].get_session_options() if "rapidocr" in sessions else None
    if opts is not None:
        print(
            f"rapidocr det session: intra_op_num_threads={opts.intra_op_num_threads} (0 = ORT default), "
            f"enable_cpu_mem_arena={opts.enable_cpu_mem_arena}"
        )
    results: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for c in order:
            session = sessions["rapidocr" if c.startswith("rapidocr") else c[:2]]
            res = run(session, xs, int(c.rsplit("x", 1)[1]), args.seconds)
            results[c].append(res)
            print(
                f"round {r + 1} {c:12s} calls {res['calls']:3.0f}  calls/s {res['calls_per_s']:.3f}  "
                f"wall/call {res['wall_ms']:7.1f} ms  process CPU/call {res['cpu_ms']:7.1f} ms  "
                f"callers' CPU/call {res['caller_cpu_ms']:7.1f} ms  vcsw/call {res['vcsw']:6.1f}  "
                f"ivcsw/call {res['ivcsw']:6.1f}  (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    print("\nmedian over rounds | calls/s | wall/call ms | process CPU/call ms | CPU/call vs 1t-x1")
    base = statistics.median(x["cpu_ms"] for x in results.get("1t-x1", [])) if "1t-x1" in results else None
    for c in configs:
        rs = results[c]
        cps = statistics.median(x["calls_per_s"] for x in rs)
        wall = statistics.median(x["wall_ms"] for x in rs)
        cpu = statistics.median(x["cpu_ms"] for x in rs)
        rel = f"{cpu / base:.2f}x" if base else "-"
        print(f"| {c} | {cps:.3f} | {wall:.0f} | {cpu:.0f} | {rel} |")


if __name__ == "__main__":
    main()
