"""Issue #21 item 2: where USG's CPU goes per document request at 16 clients, stage by stage,
against the same stages run alone — so contention and executor overhead show as numbers.

The document graph runs in process (embedded engine, node cache off) under closed-loop clients
sending ``usg bench``'s default samples (four rendered documents, each with a query text). In
the measured window every backend call (``infer`` of each model, in the thread that makes it)
and every Python node function is timed with the calling thread's CPU clock, the event loop's
thread by its own CPU clock, and the process by ``os.times()``. "Other" is the process CPU
no stage accounts for: ORT's own pool threads (a model with ``intra_op_threads`` > 1 runs part
of each call there), worker threads between tasks, the garbage collector, numpy copies made
outside the nodes. Then every stage runs alone on the same inputs, one thread, one call at a
time (``alone``): in-pipeline / alone is what running beside the other stages on the shared
cores costs (cache and memory-bandwidth contention, more threads than cores). "Alone" is one
call at a time with the other core idle; ``--bound SIDECAR`` also measures ``usg bench``'s
model-only bound (each model alone on the whole machine, e.g. two det calls side by side) after
the rounds, and prints each variant's share of it and each model's CPU per item against it.

Per model call it prints, in the pipeline and alone, the calling thread's CPU and wall time,
minor page faults, voluntary and involuntary context switches (``RUSAGE_THREAD``) and core
migrations (``/proc/thread-self/sched``): preemption, page faults and migrations per call.

Variants (``--variant``, repeatable; rounds alternate their order):
  written     examples/document_ocr/graph.yaml as is, the executor's defaults (since session 10
              the CPU gate is on: one single-threaded CPU call per core, nearest the output first;
              ``gated`` is the same)
  ungated     written, with ``Executor(cpu_slots=0)`` (the operating system shares the cores)
  det2x1      det with 2 intra-op threads and one call at a time (the graph: 1 thread, 2 calls)
  minilm2     MiniLM with 2 intra-op threads and one call at a time (the graph before session 13;
              1 thread x 2 calls since), so the CPU gate does not count its calls and its batch
              controller is off
  rec1        rec fixed at batch 1 (``max_size: 1``, the tune choice on this CPU)

Run: python benchmarks/cpu_c16.py [--duration 30] [--rounds 2] [--variant written --variant ungated]
     [--bound examples/document_ocr/graph.tuned.yaml] [--decisions]
Prints per round and variant: req/s, process CPU ms per request, and the stage table (median
over rounds). No pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from usg.backends.base import Backend
from usg.bench.samples import default_samples
from usg.graph import Graph, load_graph
from usg.runtime import Executor

GRAPH = Path(__file__).parents[1] / "examples" / "document_ocr" / "graph.yaml"


def _migrations() -> int:
    """Times the calling thread moved to another core (Linux ``/proc/thread-self/sched``; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/sched", "rb") as f:
            for line in f:
                if line.startswith(b"se.nr_migrations"):
                    return int(line.split(b":")[1])
    except OSError:
        pass
    return 0


class Meter:
    """Thread-CPU ms per stage, counted only while ``on``; per model call also the calling thread's
    minor page faults, voluntary / involuntary context switches and core migrations (``per_call``)."""

    def __init__(self) -> None:
        self.on = False
        self.ms: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        #: per stage: [wall ms, minor faults, voluntary, involuntary switches, migrations] summed over calls
        self.thread: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
        self.inline_ms = 0.0  # stages run on the event loop's thread (counted there too)
        self.loop_thread: int | None = None
        self._lock = threading.Lock()

    def add(self, stage: str, ms: float) -> None:
        if self.on:
            with self._lock:
                self.ms[stage] += ms
                self.calls[stage] += 1
                if threading.get_ident() == self.loop_thread:
                    self.inline_ms += ms

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(stage, (time.thread_time() - t0) * 1e3)

        return timed

    def wrap_thread(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``wrap`` plus the calling thread's rusage (faults, switches) and migrations over the call."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            r0, m0 = resource.getrusage(resource.RUSAGE_THREAD), _migrations()
            w0, t0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                t1, w1 = time.thread_time(), time.perf_counter()
                r1, m1 = resource.getrusage(resource.RUSAGE_THREAD), _migrations()
                if self.on:
                    d = (
                        (w1 - w0) * 1e3,
                        r1.ru_minflt - r0.ru_minflt,
                        r1.ru_nvcsw - r0.ru_nvcsw,
                        r1.ru_nivcsw - r0.ru_nivcsw,
                        m1 - m0,
                    )
                    with self._lock:
                        acc = self.thread[stage]
                        for k, v in enumerate(d):
                            acc[k] += v
                self.add(stage, (t1 - t0) * 1e3)

        return timed


def variant_graph(name: str, graph: Graph) -> tuple[Graph, int | None]:
    """(graph, cpu_slots) of a variant."""
    models = dict(graph.models)
    if name in ("written", "gated"):
        return graph, None  # the executor's default: the CPU gate on (usg.runtime.cpu_gate)
    if name == "ungated":
        return graph, 0
    if name == "det2x1":
        det = models["det"]
        models["det"] = replace(det, options={**det.options, "intra_op_threads": 2, "concurrency": 1})
    elif name == "minilm2":
        m = models["minilm"]
        opts = {k: v for k, v in m.options.items() if k != "concurrency"}
        models["minilm"] = replace(m, options={**opts, "intra_op_threads": 2})
    elif name == "rec1":
        rec = models["rec"]
        models["rec"] = replace(rec, batch=replace(rec.batch, max_size=1, adaptive=False))
    else:
        raise SystemExit(f"--variant {name}: unknown; use written, ungated, det2x1, minilm2 or rec1")
    return replace(graph, models=models), None


def instrument(ex: Executor, meter: Meter) -> None:
    """Time every backend call and Python node function of ``ex`` on the calling thread's clock."""
    seen: set[int] = set()
    for runner in ex.runners.values():
        backend: Backend = runner.backend  # type: ignore[attr-defined]
        if id(backend) in seen:
            continue
        seen.add(id(backend))
        stage = f"model {runner.model}"
        backend.infer = meter.wrap_thread(stage, backend.infer)  # type: ignore[method-assign]
    fns = ex._fns  # a benchmark: time the node functions the executor resolved
    for node, fn in list(fns.items()):
        fns[node] = meter.wrap(f"node {node}", fn)


async def one_round(
    name: str, graph: Graph, cpu_slots: int | None, inputs: list[dict[str, Any]], clients: int, duration: float
) -> dict[str, Any]:
    meter = Meter()
    meter.loop_thread = threading.get_ident()
    async with Executor(graph, timeout_s=900, cache=False, cpu_slots=cpu_slots) as ex:
        instrument(ex, meter)
        outs = await asyncio.gather(*(ex.infer(i) for i in inputs))
        text = [[ln["text"] for ln in o.outputs["lines"]] for o in outs]
        done = 0
        measuring = False
        stop = time.perf_counter() + 5 + duration  # 5 s warm-up

        async def client(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < stop:
                await ex.infer(inputs[i % len(inputs)])
                if measuring:
                    done += 1
                i += clients

        tasks = [asyncio.create_task(client(k)) for k in range(clients)]
        await asyncio.sleep(5)
        measuring = meter.on = True
        t0, c0, loop0 = time.perf_counter(), os.times(), time.thread_time()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        gate = ex.cpu_gate
        g0 = (dict(gate.calls), dict(gate.waited), dict(gate.wait_s))
        await asyncio.sleep(duration)
        t1, c1, loop1 = time.perf_counter(), os.times(), time.thread_time()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        # the CPU gate in the window: per model, calls, those that waited for a core, their wait summed
        held = {
            m: (gate.calls[m] - g0[0].get(m, 0), gate.waited[m] - g0[1].get(m, 0), gate.wait_s[m] - g0[2].get(m, 0.0))
            for m in gate.calls
        }
        measuring = meter.on = False
        await asyncio.gather(*tasks)
        decisions = []
        for model, runner in ex.runners.items():
            ctl = getattr(runner, "controller", None)
            if ctl is not None and ctl.decisions:
                t00 = ctl.decisions[0].time
                decisions += [f"{d.time - t00:6.1f}s {model:<6} cap {d.cap:>2}  {d.reason}" for d in ctl.decisions]
                costs = ", ".join(
                    f"{c}: {ctl.cost_ms(c):.3g} ms (sd {100 * b.var**0.5 / b.cost:.0f}%, {b.samples} calls)"
                    for c, b in zip(ctl.sizes, ctl._bins, strict=True)  # the controller's own per-cap means
                    if b.cost
                )
                decisions.append(f"   end {model:<6} cap {ctl.settled_cap:>2}  cost per item by cap: {costs}")
    n = max(1, done)
    cpu_ms = ((c1.user - c0.user) + (c1.system - c0.system)) * 1e3
    stages = {k: v / n for k, v in meter.ms.items()}
    # the loop thread's CPU less the stages that ran inline on it (the tokenizer, small nodes)
    stages["event loop (executor, asyncio)"] = ((loop1 - loop0) * 1e3 - meter.inline_ms) / n
    stages["other (not attributed)"] = cpu_ms / n - sum(stages.values())
    return {
        "name": name,
        "rps": done / (t1 - t0),
        "cpu_ms": cpu_ms / n,
        "sys_ms": ((c1.system - c0.system) * 1e3) / n,
        "faults": (r1.ru_minflt - r0.ru_minflt) / n,
        "ctx": ((r1.ru_nvcsw - r0.ru_nvcsw) / n, (r1.ru_nivcsw - r0.ru_nivcsw) / n),
        "gate": held,
        "stages": stages,
        "text": text,
        "n": done,
        "calls": {k: v / n for k, v in meter.calls.items()},
        "per_call": per_call(meter),
        "decisions": decisions,
    }


def per_call(meter: Meter) -> dict[str, list[float]]:
    """Per model, per call: [CPU ms, wall ms, minor faults, voluntary, involuntary switches, migrations]."""
    out = {}
    for k, acc in meter.thread.items():
        c = max(1, meter.calls[k])
        out[k] = [meter.ms[k] / c] + [v / c for v in acc]
    return out


def alone(graph: Graph, inputs: list[dict[str, Any]], repeat: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """CPU ms per request of each stage run alone: one request at a time, one worker thread; and
    the models' per-call figures (:func:`per_call`)."""

    async def run() -> tuple[dict[str, float], dict[str, list[float]]]:
        meter = Meter()
        async with Executor(graph, timeout_s=900, cache=False, cpu_slots=0) as ex:
            instrument(ex, meter)
            for i in inputs:  # warm-up
                await ex.infer(i)
            meter.on = True
            for _ in range(repeat):
                for i in inputs:
                    await ex.infer(i)
        return {k: v / (repeat * len(inputs)) for k, v in meter.ms.items()}, per_call(meter)

    return asyncio.run(run())


def print_bound(graph: Graph, sidecar: Path, results: dict[str, list[dict[str, Any]]]) -> None:
    """usg bench's no-overlap model-only bound (usg.bench.bound.BoundMeter, one measurement), each
    variant's req/s against it, and per model the pipeline's CPU per item against the bound's."""
    from usg.bench.bound import BoundMeter

    bound = BoundMeter(graph, sidecar, default_samples(), seconds=5.0)({})
    cores = os.cpu_count() or 1
    serial = bound["serial_bound_rps"]
    print(
        f"\nmodel-only bound (no overlap) {serial:.2f} req/s = {bound['ms_per_request'] * cores:.1f} core-ms a request "
        f"on {cores} cores"
    )
    for name, rs in results.items():
        rps = statistics.median(r["rps"] for r in rs)
        print(f"  {name}: {rps:.2f} req/s = {100 * rps / serial:.1f}% of it")
    print(
        f"  {'model':<8}{'items/req':>10}{'bound core-ms/item':>20}{'config':>16}"
        + "".join(f"{n:>14}" for n in results)
    )
    for model, m in bound["per_model"].items():
        core_ms = cores * 1e3 / m["machine_items_per_s"]
        cells = ""
        for rs in results.values():
            cpu = statistics.median(r["stages"].get(f"model {model}", 0.0) for r in rs) / m["items_per_request"]
            cells += f"{f'{cpu:.2f} ({cpu / core_ms:.2f}x)':>14}"
        config = f"b{m['batch']} {m['threads']}t x{m['instances']}"
        print(f"  {model:<8}{m['items_per_request']:>10.2f}{core_ms:>20.2f}{config:>16}{cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--variant", action="append", default=None)
    ap.add_argument("--alone-repeat", type=int, default=3)
    ap.add_argument("--decisions", action="store_true", help="print the batch controllers' decisions per round")
    ap.add_argument(
        "--bound",
        type=Path,
        default=None,
        metavar="SIDECAR",
        help="also measure usg bench's model-only bound with this tune sidecar (each model alone on the machine), "
        "after the rounds, and print each variant's share of it and each model's CPU per item against it",
    )
    args = ap.parse_args()
    graph = load_graph(GRAPH, export_missing=True)
    names = args.variant or ["written"]
    variants = {n: variant_graph(n, graph) for n in names}
    inputs = [{"image": s.image, "text": s.text} for s in default_samples()]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            g, slots = variants[name]
            res = asyncio.run(one_round(name, g, slots, inputs, args.clients, args.duration))
            results[name].append(res)
            print(
                f"round {r + 1} {name:<8} {res['rps']:5.2f} req/s  n={res['n']:<4} "
                f"process CPU {res['cpu_ms']:6.1f} ms/request (system {res['sys_ms']:5.1f}), "
                f"{res['faults']:7.0f} page faults/request, context switches/request "
                f"{res['ctx'][0]:.0f} voluntary {res['ctx'][1]:.0f} involuntary",
                flush=True,
            )
            gate = res["gate"]
            if gate:
                print(
                    "    CPU gate in the window (per request: calls, waited, held-back ms): "
                    + ", ".join(
                        f"{m} {c / max(1, res['n']):.2f}/{w / max(1, res['n']):.2f}/{1e3 * s / max(1, res['n']):.0f}"
                        for m, (c, w, s) in sorted(gate.items())
                    ),
                    flush=True,
                )
            if args.decisions:
                for line in res["decisions"]:
                    print(f"    {line}", flush=True)
    base, base_calls = alone(graph, inputs, args.alone_repeat)
    same = all(res["text"] == results[names[0]][0]["text"] for rs in results.values() for res in rs)
    print(f"\n{args.clients} clients, {args.rounds} rounds x {args.duration:g} s; OCR text identical: {same}")
    for name, rs in results.items():
        rps = [r["rps"] for r in rs]
        cpu = statistics.median(r["cpu_ms"] for r in rs)
        print(
            f"\n{name}: {statistics.median(rps):.2f} req/s (rounds {', '.join(f'{x:.2f}' for x in rps)}), "
            f"process CPU {cpu:.1f} ms/request ({cpu * statistics.median(rps) / 10 / (os.cpu_count() or 1):.0f}% "
            "of the cores)"
        )
        keys = sorted(
            {k for r in rs for k in r["stages"]}, key=lambda k: -statistics.median(r["stages"].get(k, 0.0) for r in rs)
        )
        print(f"  {'stage':<28}{'CPU ms/req':>11}{'share':>7}{'alone':>9}{'x alone':>9}{'calls/req':>10}")
        for k in keys:
            v = statistics.median(r["stages"].get(k, 0.0) for r in rs)
            a = base.get(k)
            calls = statistics.median(r["calls"].get(k, 0.0) for r in rs)
            ratio = f"{v / a:8.2f}x" if a else f"{'':>9}"
            alone_s = f"{a:9.1f}" if a is not None else f"{'':>9}"
            print(f"  {k:<28}{v:>11.1f}{100 * v / cpu:>6.1f}%{alone_s}{ratio}{calls:>10.2f}")
        print(f"  {'total':<28}{cpu:>11.1f}{'':>7}{sum(base.values()):>9.1f}   (alone: models and nodes only)")
        print(
            f"  per model call, in the pipeline (median of rounds) | alone: {'CPU ms':>14}{'wall ms':>16}"
            f"{'minor faults':>16}{'vol. switches':>16}{'invol. switches':>18}{'migrations':>14}"
        )
        for k in sorted({k for r in rs for k in r["per_call"]}):
            here = [statistics.median(r["per_call"][k][j] for r in rs if k in r["per_call"]) for j in range(6)]
            there = base_calls.get(k, [float("nan")] * 6)
            cells = "".join(
                f"{f'{a:.1f} | {b:.1f}':>{w}}" for a, b, w in zip(here, there, (14, 16, 16, 16, 18, 14), strict=True)
            )
            print(f"  {k:<50}{'':>8}{cells}")
    if args.bound is not None:
        print_bound(graph, args.bound, results)
    if len(names) > 1:
        ref = results[names[0]]
        for name in names[1:]:
            ratios = [b["rps"] / a["rps"] for a, b in zip(ref, results[name], strict=False) if a["rps"] > 0]
            cpu = [b["cpu_ms"] / a["cpu_ms"] for a, b in zip(ref, results[name], strict=False)]
            print(
                f"\n{name} / {names[0]}: req/s x{statistics.median(ratios):.3f} (rounds "
                f"{', '.join(f'{x:.3f}' for x in ratios)}), CPU per request x{statistics.median(cpu):.3f}"
            )


if __name__ == "__main__":
    main()
