"""Issue #21 item 1: the document graph as written, with the dynamic batch controller, against
the ``usg tune`` sidecar and against the graph as written without it (same run, alternating rounds).

Variants (16 closed-loop clients over rendered documents, embedded engine):
  written     examples/document_ocr/graph.yaml as is (what a new user gets)
  controller  the same graph with ``batch.adaptive: true`` on every batching model
  tuned       the graph with its ``usg tune`` sidecar (GRAPH.tuned.yaml) merged in

Each round builds a fresh executor, so the controller starts from the declared values every
round and its convergence is inside the measurement. After each controller round the
decisions it made (time, model, cap, wait, reason) are printed.

Run: python benchmarks/controller.py --sidecar PATH/graph.tuned.yaml [--rounds 3] [--duration 15]
(write the sidecar first: ``usg tune COPY/graph.yaml`` on a copy of the example graph.)
Prints a table and ratios; no pass/fail (machines here are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from serving_speed import closed_loop, documents, pct

from usg.graph import Graph, load_graph
from usg.graph.sidecar import apply_sidecar, sidecar_path
from usg.runtime import Executor

GRAPH = Path(__file__).parents[1] / "examples" / "document_ocr" / "graph.yaml"


def adaptive(graph: Graph) -> Graph:
    models = {
        k: replace(m, batch=replace(m.batch, adaptive=True)) if m.batch.enabled else m for k, m in graph.models.items()
    }
    return replace(graph, models=models)


async def one_round(name: str, graph: Graph, inputs: list[dict[str, Any]], clients: int, duration: float) -> dict:
    async with Executor(graph, timeout_s=900) as ex:  # this shared CPU is slow: no request may time out
        outs = await asyncio.gather(*(ex.infer(i) for i in inputs))
        text = [[ln["text"] for ln in o.outputs["lines"]] for o in outs]
        done, lat, d = await closed_loop(ex.infer, inputs, clients, duration, warmup=3)
        decisions = []
        for model, runner in ex.runners.items():
            ctl = getattr(runner, "controller", None)
            if ctl is not None:
                t0 = ctl.decisions[0].time if ctl.decisions else 0.0
                decisions += [(d.time - t0, model, d.cap, d.wait_ms, d.reason) for d in ctl.decisions]
                decisions.append((float("inf"), model, ctl.settled_cap, ctl.wait_ms, "final (settled)"))
    return {"name": name, "rps": done / d, "p95": pct(lat, 95), "n": done, "text": text, "decisions": decisions}


async def run(sidecar: Path, rounds: int, duration: float, clients: int) -> None:
    written = load_graph(GRAPH, export_missing=True)
    variants = {"written": written, "controller": adaptive(written), "tuned": apply_sidecar(written, sidecar)}
    inputs = [{"image": d} for d in documents()]
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            res = await one_round(name, variants[name], inputs, clients, duration)
            results[name].append(res)
            print(f"round {r + 1} {name:<11} {res['rps']:6.2f} req/s  p95 {res['p95']:7.0f} ms  n={res['n']}")
            if name == "controller":
                for t, model, cap, wait, reason in res["decisions"]:
                    when = "  end" if t == float("inf") else f"{t:5.1f}s"
                    print(f"    {when} {model:<8} cap {cap:>2} wait {wait:4.1f} ms  {reason}")
    same = all(res["text"] == results["written"][0]["text"] for rs in results.values() for res in rs)
    print(f"\nDocument graph, {clients} clients, {rounds} rounds x {duration:g} s (embedded engine)")
    print(f"{'variant':<12}{'req/s (median)':>16}{'min':>8}{'max':>8}{'p95 ms (median)':>17}{'n total':>9}")
    med = {}
    for name, rs in results.items():
        rps = [x["rps"] for x in rs]
        med[name] = statistics.median(rps)
        p95 = statistics.median(x["p95"] for x in rs)
        print(f"{name:<12}{med[name]:>16.2f}{min(rps):>8.2f}{max(rps):>8.2f}{p95:>17.0f}{sum(x['n'] for x in rs):>9}")
    print(f"OCR text identical across variants: {same}")
    print(f"as-written + controller / tuned: {med['controller'] / med['tuned']:.2f}x (target >= 0.95x)")
    print(f"as-written + controller / as-written: {med['controller'] / med['written']:.2f}x")
    print(f"as-written / tuned: {med['written'] / med['tuned']:.2f}x")
    per_round = [c["rps"] / t["rps"] for c, t in zip(results["controller"], results["tuned"], strict=True)]
    print("controller / tuned per round: " + ", ".join(f"{x:.2f}" for x in per_round))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sidecar", type=Path, default=sidecar_path(GRAPH))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    if not args.sidecar.exists():
        raise SystemExit(
            f"no usg tune sidecar at {args.sidecar}; run `usg tune` on a copy of {GRAPH} and pass --sidecar"
        )
    asyncio.run(run(args.sidecar, args.rounds, args.duration, args.clients))


if __name__ == "__main__":
    main()
