"""``usg tune``: profile each ONNX model across batch sizes and intra-op threads, pick a config.

Like Triton Model Analyzer, but on items the graph really produces: the graph runs once on
sample inputs with a recording wrapper around each model backend (so rec sees real crops
with RapidOCR's widths, MiniLM real token lengths), then each model is timed alone on
batches built from those items. Per model the choice maximises items/s among configs whose
p95 batch latency is within ``--p95-ms`` (with ``cpus // threads`` concurrent instances,
like Triton's instance count), preferring the smaller batch and fewer threads
when throughput is within ``tolerance`` (5%) of the best. The result goes into a sidecar
``GRAPH.tuned.yaml`` that :func:`usg.graph.sidecar.apply_sidecar` merges into a loaded graph.

Sidecar format (version 1)::

    usg_tune: 1
    graph: graph.yaml               # the graph it was tuned for (file name)
    machine: {cpus: 2, processor: "..."}
    p95_ms: 100.0
    items_per_request: {det: 1.0, cls: 3.5, rec: 3.5, minilm: 2.0}   # measured on the samples
    models:
      rec:
        options: {intra_op_threads: 1, concurrency: 2}  # merged into models.rec.options
        batch: {max_size: 8, preferred_sizes: [8]}      # replaces these BatchPolicy fields
        profile: [{batch: 1, threads: 1, p50_ms: .., p95_ms: .., items_per_s: ..}, ...]
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.backends.base import Backend, DelegatingBackend
from usg.bench.samples import Sample
from usg.graph.model import Graph, ModelDef
from usg.graph.sidecar import SIDECAR_VERSION

__all__ = [
    "ModelChoice",
    "ProfilePoint",
    "capture_items",
    "choose",
    "machine_items_per_s",
    "profile_model",
    "write_sidecar",
]


@dataclass(frozen=True)
class ProfilePoint:
    model: str
    batch: int
    threads: int
    p50_ms: float
    p95_ms: float
    items_per_s: float
    runs: int = 0

    @property
    def core_ms_per_item(self) -> float:
        """CPU time one item costs (latency × threads / batch): what bounds a shared machine."""
        return self.p50_ms * self.threads / self.batch

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "threads": self.threads,
            "p50_ms": round(self.p50_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "items_per_s": round(self.items_per_s, 2),
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, model: str, d: Mapping[str, Any]) -> ProfilePoint:
        return cls(
            model,
            int(d["batch"]),
            int(d["threads"]),
            float(d["p50_ms"]),
            float(d["p95_ms"]),
            float(d["items_per_s"]),
            int(d.get("runs", 0)),
        )


@dataclass(frozen=True)
class ModelChoice:
    model: str
    batch: int
    threads: int
    point: ProfilePoint | None
    reason: str
    instances: int = 1  # concurrent backend calls (options.concurrency)


FALLBACK_LATENCY_FACTOR = 2.0
"""When no config meets ``--p95-ms``: how far above the lowest reachable p95 a config may be."""


def machine_items_per_s(point: ProfilePoint, cpus: int) -> float:
    """Items/s of the whole machine running ``cpus // threads`` instances of this config."""
    return point.items_per_s * max(1, cpus // point.threads)


def choose(
    points: Sequence[ProfilePoint], p95_ms: float, *, cpus: int | None = None, tolerance: float = 0.05
) -> ModelChoice:
    """The config with the best machine throughput (items/s × the ``cpus // threads`` instances
    that fit, as Triton Model Analyzer varies instance counts) whose p95 ≤ ``p95_ms``; within
    ``tolerance`` of the best, the smallest batch (then the fewest threads) wins — a larger
    batch only adds latency.

    When no config meets ``p95_ms`` the target is out of reach on this machine, and the lowest
    latency alone is a poor pick: on a loaded server the config that serves more items a second
    queues less. The bound is then relaxed to ``FALLBACK_LATENCY_FACTOR`` × the lowest p95 any
    config reached, and the same rule picks within it (det on 2 cores: 1 thread × 2 instances
    serves 1.5× the items of 2 threads × 1 at 1.3× its latency)."""
    if not points:
        raise ValueError("no profile points to choose from")
    n = cpus or os.cpu_count() or 1
    model = points[0].model
    limit = p95_ms
    ok = [p for p in points if p.p95_ms <= limit]
    note = ""
    if not ok:
        lowest = min(p.p95_ms for p in points)
        limit = lowest * FALLBACK_LATENCY_FACTOR
        ok = [p for p in points if p.p95_ms <= limit]
        note = (
            f"no config meets p95 ≤ {p95_ms:g} ms (the lowest is {lowest:.1f} ms; raise --p95-ms to at "
            f"least that); the best throughput within {FALLBACK_LATENCY_FACTOR:g}× of it was taken: "
        )
    best = max(machine_items_per_s(p, n) for p in ok)
    near = [p for p in ok if machine_items_per_s(p, n) >= best * (1 - tolerance)]
    pick = min(near, key=lambda p: (p.batch, p.threads, -p.items_per_s))
    instances = max(1, n // pick.threads)
    return ModelChoice(
        model,
        pick.batch,
        pick.threads,
        pick,
        f"{note}{machine_items_per_s(pick, n):.1f} items/s with {instances} instance(s) (best {best:.1f}), "
        f"p95 {pick.p95_ms:.1f} ms ≤ {limit:.4g} ms",
        instances,
    )


# -- capturing representative items ------------------------------------------------------------
class RecordingBackend(DelegatingBackend):
    """Delegates to a backend and keeps every item it is given (batching is off while recording)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.items: list[dict[str, Any]] = []

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.items.append(dict(inputs))
        return self.inner.infer(inputs)


def capture_items(graph: Graph, samples: Sequence[Sample]) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Run the graph once per sample (no batching) and return each ONNX model's items and the
    number of requests, so items per request can be derived."""
    from usg.runtime import Executor
    from usg.runtime.runner import backend_for

    recorders = {n: RecordingBackend(backend_for(m)) for n, m in graph.models.items() if m.backend == "onnxruntime"}

    async def go() -> None:
        async with Executor(graph, batching=False, backends=recorders, cache=False) as ex:  # every item recorded
            for s in samples:
                await ex.infer(s.inputs())

    asyncio.run(go())
    return {n: r.items for n, r in recorders.items()}, len(samples)


def make_batch(model: ModelDef, items: Sequence[Mapping[str, Any]], size: int, offset: int = 0) -> dict[str, Any]:
    """A batch of ``size`` recorded items (from ``offset``) the batcher could form: padded where
    the model is pad-safe, otherwise items of the most common shape (repeated if too few)."""
    from usg.runtime.padding import assemble

    pool = batch_pool(model, items)
    chosen = [pool[(offset + i) % len(pool)] for i in range(size)]
    inputs, _real, _padded = assemble(chosen, model.batch.pad)
    return inputs


def batch_pool(model: ModelDef, items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Items that may share a batch: all (pad-safe model) or those of the most common shape."""
    from usg.runtime.padding import group_key

    pad = model.batch.pad
    if pad is not None:
        return list(items)
    keys = [group_key(it, pad) for it in items]
    common = Counter(keys).most_common(1)[0][0]
    return [it for it, k in zip(items, keys, strict=True) if k == common]


#: a batch whose inputs would take more than this is not profiled (its memory is checked before it is made)
MAX_BATCH_BYTES = 1 << 30


def profile_model(
    model: ModelDef,
    items: Sequence[Mapping[str, Any]],
    *,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    threads: Sequence[int] = (1, 2),
    p95_ms: float = 100.0,
    seconds_per_point: float = 1.0,
    min_runs: int = 3,
    max_runs: int = 30,
    progress: Callable[[str], None] | None = None,
) -> list[ProfilePoint]:
    """Time the model alone on recorded items for each (threads, batch) pair.

    Larger batches are skipped once a batch's p50 exceeds twice ``p95_ms`` (they only get slower)."""
    from usg.backends.onnxruntime import OnnxRuntimeBackend

    if model.path is None or not items:
        return []
    item_bytes = max(sum(np.asarray(v).nbytes for v in item.values()) for item in items)
    too_big = [b for b in batch_sizes if b * item_bytes > MAX_BATCH_BYTES]
    if too_big and progress is not None:
        progress(
            f"{model.name}: batch size(s) {', '.join(map(str, too_big))} skipped: a batch's inputs would take "
            f"{too_big[0] * item_bytes / 2**30:.1f} GiB or more (the limit is {MAX_BATCH_BYTES // 2**30} GiB)"
        )
    batch_sizes = [b for b in batch_sizes if b not in too_big]
    points: list[ProfilePoint] = []
    for t in threads:
        backend = OnnxRuntimeBackend(Path(model.path), {**model.options, "intra_op_threads": t}, name=model.name)
        backend.load()
        try:
            for b in batch_sizes:
                # several batches over the recorded items, so every item length is represented
                n_batches = max(1, min(8, len(batch_pool(model, items)) // b))
                batches = [make_batch(model, items, b, offset=i * b) for i in range(n_batches)]
                for batch in batches:
                    backend.infer(batch)  # warm-up (allocations, first-run kernels)
                times: list[float] = []
                start = time.perf_counter()
                while len(times) < max(max_runs, n_batches) and (
                    len(times) < max(min_runs, n_batches) or time.perf_counter() - start < seconds_per_point
                ):
                    batch = batches[len(times) % n_batches]
                    t0 = time.perf_counter()
                    backend.infer(batch)
                    times.append((time.perf_counter() - t0) * 1e3)
                arr = np.asarray(times)
                p50 = float(np.percentile(arr, 50))
                # items/s from the median batch time: robust to other work on a shared machine
                point = ProfilePoint(model.name, b, t, p50, float(np.percentile(arr, 95)), b / (p50 / 1e3), len(times))
                points.append(point)
                if progress is not None:
                    progress(
                        f"{model.name}: batch {b}, {t} thread(s): p50 {p50:.1f} ms, {point.items_per_s:.1f} items/s"
                    )
                if p50 > 2 * p95_ms:
                    break
        finally:
            backend.close()
    return points


# -- sidecar ----------------------------------------------------------------------------------
def write_sidecar(
    graph: Graph,
    choices: Mapping[str, ModelChoice],
    profiles: Mapping[str, Sequence[ProfilePoint]],
    items_per_request: Mapping[str, float],
    p95_ms: float,
    path: Path,
) -> dict[str, Any]:
    import yaml

    models: dict[str, Any] = {}
    for name, c in choices.items():
        policy = graph.models[name].batch
        batch: dict[str, Any] = {"max_size": c.batch, "preferred_sizes": [c.batch] if c.batch > 1 else []}
        if c.batch > 1 and policy.max_delay_ms <= 0:
            batch["max_delay_ms"] = 2.0
        models[name] = {
            "options": {"intra_op_threads": c.threads, "concurrency": c.instances},
            "batch": batch,
            "reason": c.reason,
            "profile": [p.to_json() for p in profiles.get(name, [])],
        }
    doc = {
        "usg_tune": SIDECAR_VERSION,
        "graph": graph.source.name if graph.source else graph.name,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "p95_ms": p95_ms,
        "items_per_request": {k: round(v, 3) for k, v in items_per_request.items()},
        "models": models,
    }
    header = "# written by `usg tune`; merged into the graph by usg.graph.sidecar.apply_sidecar (delete to undo)\n"
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True), encoding="utf-8")
    return doc


def items_per_request(items: Mapping[str, Sequence[Any]], requests: int) -> dict[str, float]:
    return {name: len(v) / max(1, requests) for name, v in items.items()}
