"""Issue #3 speed targets, measured in one run against baselines on the same machine.

A. MiniLM text embedding, 32 concurrent clients: USG with the graph's batch policy vs the
   same graph with batching off and one request at a time through the model, each call on
   every core (requests/s ratio, target >= 3x; and p95 <= 2 x p50 for USG).
B. Document OCR graph, 8 concurrent clients over the same document images: USG vs RapidOCR's
   own engine called per request from a thread pool of 8 (one engine per thread), with the
   OCR text checked identical (throughput ratio, target >= 1.2x).

Run: python benchmarks/serving_speed.py [--duration 20] [--only minilm|ocr] [--gate on,off] [--rounds N]
``--gate on,off`` runs USG with the executor's CPU gate on (the default: one single-threaded CPU
call per usable core, nearest the output first) and off (``cpu_slots=0``), alternating for
``--rounds`` rounds; the baseline runs once, after them, and each ratio is against it.
Prints a table; no pass/fail (machines here are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from usg.graph import load_graph
from usg.runtime import Executor
from usg.runtime.cpu_gate import usable_cores
from usg.testing.documents import Line, render_document

GRAPH = Path(__file__).parents[1] / "examples" / "document_ocr" / "graph.yaml"
TEXTS = [
    "invoice total due",
    "where is my parcel with tracking code QX93020",
    "refund policy for damaged goods shipped abroad within the european union",
    "hi",
    "quarterly revenue grew by twelve percent while operating costs stayed flat " * 2,
    "contact support",
]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


async def closed_loop(
    call: Any, inputs: list[dict[str, Any]], clients: int, duration: float, warmup: float
) -> tuple[int, list[float], float]:
    """Each client sends the next input as soon as its previous request returns."""
    latencies: list[float] = []
    done = 0
    t_start = time.perf_counter()
    measure_from = t_start + warmup
    stop_at = measure_from + duration

    async def client(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            await call(inputs[i % len(inputs)])
            t1 = time.perf_counter()
            if t0 >= measure_from and t1 <= stop_at:
                latencies.append((t1 - t0) * 1e3)
                done += 1
            i += clients

    await asyncio.gather(*(client(k) for k in range(clients)))
    return done, latencies, duration


def row(name: str, done: int, lat: list[float], duration: float) -> dict[str, float | str]:
    return {
        "system": name,
        "req/s": done / duration,
        "p50 ms": pct(lat, 50),
        "p95 ms": pct(lat, 95),
        "p99 ms": pct(lat, 99),
        "n": done,
    }


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'system':<50}{'req/s':>9}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'n':>7}")
    for r in rows:
        print(
            f"{r['system']:<50}{r['req/s']:>9.1f}{r['p50 ms']:>10.1f}{r['p95 ms']:>10.1f}{r['p99 ms']:>10.1f}"
            f"{r['n']:>7}"
        )


GATES = {"on": None, "off": 0}  # --gate NAME -> Executor(cpu_slots=...)


def variants(gates: list[str], rounds: int) -> list[tuple[str, int | None]]:
    """(row label suffix, cpu_slots) per USG run: the gate variants alternating, round by round."""
    if gates == ["on"] and rounds == 1:
        return [("", None)]
    return [
        (f", gate {g}" + (f", round {r + 1}" if rounds > 1 else ""), GATES[g]) for r in range(rounds) for g in gates
    ]


def ratios(rows: list[dict[str, Any]], base: dict[str, Any], what: str) -> None:
    for r in rows:
        print(f"throughput ratio {r['system']} / {what}: {r['req/s'] / base['req/s']:.2f}x")


async def bench_minilm(duration: float, runs: list[tuple[str, int | None]], clients: int = 32) -> None:
    graph = load_graph(GRAPH, export_missing=True)
    inputs = [{"text": t} for t in TEXTS]
    rows = []
    for label, slots in runs:
        async with Executor(graph, cache=False, cpu_slots=slots) as ex:
            done, lat, d = await closed_loop(ex.infer, inputs, clients, duration, warmup=2)
            rows.append(row(f"USG (dynamic batching){label}", done, lat, d))
    # baseline: the same graph, no batching, one request at a time through the model, each call on
    # every core (MiniLM runs 1 thread x 2 calls in the graph since issue #21 session 13; one call
    # at a time on 1 thread would leave a core idle and flatter the ratio)
    cores = usable_cores()
    unbatched = replace(
        graph,
        models={
            k: replace(m, options={**m.options, "concurrency": 1, "intra_op_threads": cores})
            if m.backend == "onnxruntime"
            else replace(m, options={**m.options, "concurrency": 1})
            for k, m in graph.models.items()
        },
    )
    async with Executor(unbatched, batching=False, cache=False) as ex:
        done, lat, d = await closed_loop(ex.infer, inputs, clients, duration, warmup=2)
        rows.append(row("same model, one request at a time", done, lat, d))
    print_table(f"A. MiniLM text embedding, {clients} concurrent clients, {duration:g} s", rows)
    *usg, base = rows
    if len(usg) == 1:
        print(f"throughput ratio USG / one-at-a-time: {usg[0]['req/s'] / base['req/s']:.2f}x (target >= 3x)")
        print(f"USG p95 / p50: {usg[0]['p95 ms'] / usg[0]['p50 ms']:.2f} (target <= 2)")
        return
    ratios(usg, base, "one-at-a-time (target >= 3x)")
    for r in usg:
        print(f"{r['system']} p95 / p50: {r['p95 ms'] / r['p50 ms']:.2f} (target <= 2)")


def documents() -> list[np.ndarray]:
    fonts = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"]
    docs = []
    for i in range(6):
        f = fonts[i % len(fonts)]
        docs.append(
            render_document(
                [
                    Line(f"INVOICE 2026-{1000 + i}", 32, "DejaVuSans-Bold.ttf"),
                    Line(f"Customer number {48213 + 17 * i}", 26, f),
                    Line("Item: servo motor x4   EUR 312.40", 24, f),
                    Line("Item: control board x1   EUR 89.00", 24, f),
                    Line(f"Total due: EUR {401.40 + i:.2f}", 28, "DejaVuSans-Bold.ttf"),
                    Line("Payment within 30 days", 22, angle=3 if i % 2 else 0),
                ]
            )
        )
    return docs


async def bench_ocr(duration: float, runs: list[tuple[str, int | None]], clients: int = 8) -> None:
    from rapidocr_onnxruntime import RapidOCR

    graph = load_graph(GRAPH, export_missing=True)
    docs = documents()
    inputs = [{"image": d} for d in docs]
    rows = []
    texts = []
    for label, slots in runs:
        async with Executor(graph, cache=False, cpu_slots=slots) as ex:
            texts.append([[ln["text"] for ln in (await ex.infer(i)).outputs["lines"]] for i in inputs])
            done, lat, d = await closed_loop(ex.infer, inputs, clients, duration, warmup=3)
            rows.append(row(f"USG document-OCR graph{label}", done, lat, d))
            g = ex.cpu_gate
            waits = ", ".join(f"{m} {g.waited[m]}/{g.calls[m]} ({g.wait_s[m]:.1f} s)" for m in sorted(g.calls))
            print(f"  {label.lstrip(', ') or 'gate on'}: calls that waited for a core / gated calls: {waits or 'none'}")

    local = threading.local()

    def engine() -> Any:
        if not hasattr(local, "ocr"):
            local.ocr = RapidOCR()
        return local.ocr

    def rapid(image: np.ndarray) -> list[str]:
        res, _ = engine()(np.ascontiguousarray(image[:, :, ::-1]))
        return [r[1] for r in (res or [])]

    pool = ThreadPoolExecutor(clients)
    loop = asyncio.get_running_loop()
    ref_text = [await loop.run_in_executor(pool, rapid, d) for d in docs]
    same = all(t == ref_text for t in texts)

    async def call(inp: dict[str, Any]) -> Any:
        return await loop.run_in_executor(pool, rapid, inp["image"])

    done, lat, d = await closed_loop(call, inputs, clients, duration, warmup=3)
    pool.shutdown()
    rows.append(row(f"RapidOCR, thread pool of {clients}", done, lat, d))
    print_table(f"B. Document OCR, {clients} concurrent clients, {duration:g} s", rows)
    print(f"OCR text identical to RapidOCR's on all {len(docs)} documents (every USG run): {same}")
    *usg, base = rows
    ratios(usg, base, "RapidOCR pool (target >= 1.2x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--only", choices=["minilm", "ocr"])
    ap.add_argument("--gate", default="on", help="USG variants, comma-separated: on (the default gate), off")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the USG variants, alternating")
    args = ap.parse_args()
    gates = args.gate.split(",")
    if any(g not in GATES for g in gates):
        ap.error(f"--gate {args.gate}: use on, off or on,off")
    runs = variants(gates, args.rounds)
    if args.only in (None, "minilm"):
        asyncio.run(bench_minilm(args.duration, runs))
    if args.only in (None, "ocr"):
        asyncio.run(bench_ocr(args.duration, runs))


if __name__ == "__main__":
    main()
