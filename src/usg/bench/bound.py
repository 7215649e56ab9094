"""Model-only bound: the request rate this machine could reach if only model compute counted.

``BoundMeter`` (what ``usg bench`` reports): each model is run alone on the whole machine at
its tuned batch size for a few seconds, right after each USG run, with the tuned intra-op
threads and instance count (concurrent calls) and with the two ways of filling every core
(one thread per call and one call per core, or one call at a time on every core), keeping the
fastest; with the items one request needs (1 det, N cls and N rec crops, 1–2 MiniLM texts —
measured in the benchmark), each model can serve throughput_m / items_m requests/s. The
slowest one — the bottleneck stage — is the bound if the stages overlapped for free; since
the models share the cores, the no-overlap bound 1 / Σ items_m / throughput_m is the one a
server on this machine can approach. ``summarize_bounds`` makes the run's bound of its
measurements: per model the fastest rate any of them reached, with their spread.
``model_only_bound`` is a profile-only estimate from ``usg tune``'s table (cheapest
``p50 × threads / batch`` per item, summed over models, assuming perfect scaling over cores).
Pre/post-processing, tokenisation and the executor itself are deliberately left out: the bound
is what a perfect server would reach.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from usg.bench.samples import Sample
from usg.bench.tune import ProfilePoint
from usg.graph.model import Graph

__all__ = ["BoundMeter", "machine_throughput", "measure_bound", "model_only_bound", "summarize_bounds"]


def model_only_bound(
    profiles: Mapping[str, Sequence[ProfilePoint]],
    items_per_request: Mapping[str, float],
    *,
    p95_ms: float | None = None,
    cores: int | None = None,
    max_batch: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """``{"bound_rps", "bottleneck", "per_model": {model: {items, core_ms_per_item, core_ms_per_request}}}``.

    ``max_batch`` caps the batch size a model may use (the batch sizes the graph can form)."""
    n_cores = cores or os.cpu_count() or 1
    per_model: dict[str, dict[str, float]] = {}
    total = 0.0
    for model, items in items_per_request.items():
        points = [p for p in profiles.get(model, []) if p_ok(p, p95_ms, (max_batch or {}).get(model))]
        if not points or items <= 0:
            continue
        best = min(points, key=lambda p: p.core_ms_per_item)
        cost = best.core_ms_per_item * items
        per_model[model] = {
            "items_per_request": items,
            "core_ms_per_item": best.core_ms_per_item,
            "core_ms_per_request": cost,
            "batch": best.batch,
            "threads": best.threads,
        }
        total += cost
    if total <= 0:
        return {"bound_rps": 0.0, "bottleneck": None, "per_model": per_model, "cores": n_cores, "basis": "no profile"}
    bottleneck = max(per_model, key=lambda m: per_model[m]["core_ms_per_request"])
    return {
        "bound_rps": n_cores * 1000.0 / total,
        "core_ms_per_request": total,
        "bottleneck": bottleneck,
        "bottleneck_share": per_model[bottleneck]["core_ms_per_request"] / total,
        "per_model": per_model,
        "cores": n_cores,
        "basis": f"{n_cores} cores shared by all models, cheapest profiled config per model",
    }


def p_ok(point: ProfilePoint, p95_ms: float | None, max_batch: int | None) -> bool:
    if p95_ms is not None and point.p95_ms > p95_ms:
        return False
    return max_batch is None or point.batch <= max_batch


def machine_throughput(
    model: Any, items: Sequence[Mapping[str, Any]], *, batch: int, threads: int, instances: int, seconds: float
) -> float:
    """Items/s of one model alone on this machine: ``instances`` threads calling one session
    (as the executor's ``concurrency`` does) with batches of ``batch`` recorded items."""
    import threading
    import time
    from pathlib import Path

    from usg.backends.onnxruntime import OnnxRuntimeBackend
    from usg.bench.tune import batch_pool, make_batch

    backend = OnnxRuntimeBackend(Path(model.path), {**model.options, "intra_op_threads": threads}, name=model.name)
    backend.load()
    try:
        if batch == 1:  # every recorded item, not only those of the most common shape (for det:
            # the widest of the four documents, 11% above the mean cost)
            batches = [make_batch(model, [it], 1) for it in items[:8]]
        else:
            n = max(1, min(8, len(batch_pool(model, items)) // batch))
            batches = [make_batch(model, items, batch, offset=i * batch) for i in range(n)]
        n = len(batches)
        for b in batches:
            backend.infer(b)
        done = [0] * instances
        last = [0.0] * instances
        start = time.perf_counter()
        stop = start + seconds

        def worker(k: int) -> None:
            # at least 4 calls each: det's calls take ~0.5 s here, so 3 s hold only 6; and whole passes
            # over the recorded batches, so each counts equally (det's four documents differ by 1.2x in
            # cost: a window ending after the widest one twice would understate the rate)
            i = k
            while time.perf_counter() < stop or done[k] < 4 * batch or (i - k) % n:
                backend.infer(batches[i % n])
                done[k] += batch
                last[k] = time.perf_counter()
                i += 1

        pool = [threading.Thread(target=worker, args=(k,)) for k in range(instances)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        # each worker's own rate up to its last call: counting to the end of the slowest worker's
        # last call (which ran past the deadline, partly alone) understated det's rate by ~20%
        return sum(d / (t - start) for d, t in zip(done, last, strict=True) if t > start)
    finally:
        backend.close()


class BoundMeter:
    """Measures the model-only bound on demand (``usg bench`` calls it right after each USG run,
    so each run is compared with a bound taken under the same background load). Each model runs
    alone on the whole machine at its tuned batch size, threads and instance count (concurrent
    calls on one session) on items captured once from ``samples``. Each model can then serve
    throughput_m / items_m requests/s; the bound is that of the slowest model, the bottleneck
    stage (stages overlapping perfectly). ``serial_bound_rps`` is the pessimistic variant with
    no overlap: the inverse of Σ items_m / throughput_m."""

    def __init__(
        self, graph: Graph, sidecar: Path, samples: Sequence[Sample], *, seconds: float = 5.0, cores: int | None = None
    ) -> None:
        from usg.graph.sidecar import apply_sidecar, read_sidecar

        self.doc = read_sidecar(sidecar)
        self.graph = apply_sidecar(graph, sidecar)
        self.samples = list(samples)
        self.seconds = seconds
        self.cores = cores or os.cpu_count() or 1
        self._items: dict[str, list[dict[str, Any]]] | None = None

    def __call__(self, items_per_request: Mapping[str, float]) -> dict[str, Any]:
        from usg.bench.tune import capture_items

        if self._items is None:
            self._items, _ = capture_items(self.graph, self.samples)
        items = self._items
        per_request = {**(self.doc.get("items_per_request") or {}), **items_per_request}
        per_model: dict[str, dict[str, float]] = {}
        total_s = 0.0
        for name in self.doc.get("models") or {}:
            if name not in items or not items[name] or float(per_request.get(name, 0)) <= 0:
                continue
            model = self.graph.models[name]
            tuned = (
                int(model.options.get("intra_op_threads", 1) or 1),
                max(1, int(model.options.get("concurrency", 1))),
            )
            batch = max(1, model.batch.max_size)
            thr, (threads, instances) = max(
                (
                    machine_throughput(model, items[name], batch=batch, threads=t, instances=k, seconds=self.seconds),
                    (t, k),
                )
                for t, k in dict.fromkeys([tuned, (1, self.cores), (self.cores, 1)])
            )
            n = float(per_request[name])
            per_model[name] = {
                "items_per_request": n,
                "machine_items_per_s": thr,
                "ms_per_request": n / thr * 1e3,
                "batch": batch,
                "threads": threads,
                "instances": instances,
            }
            total_s += n / thr
        if total_s <= 0:
            return {"bound_rps": 0.0, "bottleneck": None, "per_model": per_model, "basis": "no tuned models"}
        # the bottleneck stage: the model that can serve the fewest requests/s on the whole machine
        for m in per_model.values():
            m["stage_rps"] = 1e3 / m["ms_per_request"]
        bottleneck = min(per_model, key=lambda m: per_model[m]["stage_rps"])
        return {
            "bound_rps": per_model[bottleneck]["stage_rps"],
            "serial_bound_rps": 1.0 / total_s,
            "ms_per_request": total_s * 1e3,
            "bottleneck": bottleneck,
            "bottleneck_share": per_model[bottleneck]["ms_per_request"] / (total_s * 1e3),
            "per_model": per_model,
            "basis": "bottleneck stage: each model alone on the whole machine at its tuned batch size and "
            "fastest threads x instances, measured right after each USG run, divided by its items per request",
        }


def measure_bound(
    graph: Graph,
    sidecar: Path,
    samples: Sequence[Sample],
    items_per_request: Mapping[str, float],
    *,
    seconds: float = 3.0,
) -> dict[str, Any]:
    """One measurement of the bound (see :class:`BoundMeter`)."""
    return BoundMeter(graph, sidecar, samples, seconds=seconds)(items_per_request)


def summarize_bounds(bounds: Sequence[Mapping[str, Any]], levels: Sequence[float]) -> dict[str, Any]:
    """The run's bound from its measurements (one after each USG run; each carries ``level`` and
    ``usg_rps``, USG's throughput in the run just before it).

    Per model, the fastest rate (``machine_items_per_s``) any measurement of the run reached: a
    model alone on the machine cannot run faster than its machine allows, only slower (another
    process took a core for part of its window), so the fastest of several measurements is the
    least disturbed one; the bound stays an upper bound, never pulled down by one disturbed window.
    With the items per request of each level (the mean over its measurements), that gives the
    bottleneck-stage and no-overlap bounds per level and the share of each USG's mean throughput
    at that level reached. Each single measurement is kept in ``measurements`` with the share USG
    reached of it, and ``bound_range`` / ``serial_bound_range`` give their spread. Without per-model
    rates (or USG throughputs) the single measurements are averaged instead."""
    summary = dict(bounds[-1])
    summary.pop("level", None)
    keys = ("level", "bound_rps", "achieved", "serial_bound_rps", "achieved_serial", "usg_rps")
    summary["measurements"] = [{k: b.get(k) for k in keys} for b in bounds]
    summary["bound_range"] = [min(b["bound_rps"] for b in bounds), max(b["bound_rps"] for b in bounds)]
    serial = [b["serial_bound_rps"] for b in bounds if b.get("serial_bound_rps")]
    if serial:
        summary["serial_bound_range"] = [min(serial), max(serial)]
    fastest: dict[str, dict[str, Any]] = {}
    for b in bounds:
        for name, m in (b.get("per_model") or {}).items():
            if m.get("machine_items_per_s") and m["machine_items_per_s"] > fastest.get(name, {}).get(
                "machine_items_per_s", 0.0
            ):
                fastest[name] = dict(m)
    if not fastest or any(b.get("usg_rps") is None for b in bounds):
        return _mean_of_measurements(summary, bounds, levels)
    achieved: dict[str, float] = {}
    achieved_serial: dict[str, float] = {}
    for level in levels:
        here = [b for b in bounds if b["level"] == level]
        if not here:
            continue
        per_model: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(n for b in here for n in b.get("per_model") or {}):
            items = [b["per_model"][name]["items_per_request"] for b in here if name in (b.get("per_model") or {})]
            if name in fastest and items:
                n = sum(items) / len(items)
                ms = n / fastest[name]["machine_items_per_s"] * 1e3
                per_model[name] = {**fastest[name], "items_per_request": n, "ms_per_request": ms, "stage_rps": 1e3 / ms}
        if not per_model:
            continue
        total_ms = sum(m["ms_per_request"] for m in per_model.values())
        bottleneck = min(per_model, key=lambda m: per_model[m]["stage_rps"])
        usg = sum(b["usg_rps"] for b in here) / len(here)
        summary.update(
            bound_rps=per_model[bottleneck]["stage_rps"],
            serial_bound_rps=1e3 / total_ms,
            ms_per_request=total_ms,
            bottleneck=bottleneck,
            bottleneck_share=per_model[bottleneck]["ms_per_request"] / total_ms,
            per_model=per_model,
        )
        achieved[f"{level:g}"] = usg / summary["bound_rps"]
        achieved_serial[f"{level:g}"] = usg / summary["serial_bound_rps"]
    summary["achieved"], summary["achieved_serial"] = achieved, achieved_serial
    summary["basis"] = (
        f"{summary.get('basis', '')}; per model the fastest of the run's {len(bounds)} measurement(s), "
        "against USG's mean throughput"
    )
    return summary


def _mean_of_measurements(
    summary: dict[str, Any], bounds: Sequence[Mapping[str, Any]], levels: Sequence[float]
) -> dict[str, Any]:
    summary["bound_rps"] = sum(b["bound_rps"] for b in bounds) / len(bounds)
    serial = [b["serial_bound_rps"] for b in bounds if b.get("serial_bound_rps")]
    if serial:
        summary["serial_bound_rps"] = sum(serial) / len(serial)
    for key in ("achieved", "achieved_serial"):
        achieved: dict[str, float] = {}
        for level in levels:
            fracs = [b[key] for b in bounds if b["level"] == level and b.get(key) is not None]
            if fracs:
                achieved[f"{level:g}"] = sum(fracs) / len(fracs)
        summary[key] = achieved
    return summary
