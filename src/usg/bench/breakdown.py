"""Per-model breakdown of a run: items, batch sizes, queue wait, compute, padding waste.

In process it is collected by an :class:`~usg.runtime.observer.Observer`; against a server it
is the difference of two ``/metrics`` scrapes (the server's own histograms and counters).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.runtime.batcher import BatchEvent
from usg.runtime.observer import NodeEvent, Observer

__all__ = ["BreakdownObserver", "ModelBreakdown", "breakdown_from_metrics", "parse_prometheus"]


@dataclass
class ModelBreakdown:
    model: str
    items: int = 0
    calls: int = 0
    queue_ms_sum: float = 0.0
    compute_ms_sum: float = 0.0  # summed over backend calls
    real_elements: int = 0
    padded_elements: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    requests: int = 0  # requests of the run (to give items per request)
    request_items: int | None = None  # items of exactly those requests (None: use items)
    batch_cap: int | None = None  # the batch cap at the end of the run (the controller's, else max_size)
    controller: str = ""  # what the batch controller did in the run ("" when unknown or not batching)

    @property
    def mean_batch(self) -> float:
        return self.items / self.calls if self.calls else float("nan")

    @property
    def queue_ms_mean(self) -> float:
        return self.queue_ms_sum / self.items if self.items else float("nan")

    @property
    def compute_ms_mean(self) -> float:
        return self.compute_ms_sum / self.calls if self.calls else float("nan")

    @property
    def padding_waste(self) -> float:
        if not self.padded_elements:
            return 0.0
        return (self.padded_elements - self.real_elements) / self.padded_elements

    @property
    def items_per_request(self) -> float:
        if not self.requests:
            return float("nan")
        return (self.items if self.request_items is None else self.request_items) / self.requests

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 4)

        return {
            "model": self.model,
            "items": self.items,
            "calls": self.calls,
            "mean_batch": num(self.mean_batch),
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "queue_ms_mean": num(self.queue_ms_mean),
            "compute_ms_mean": num(self.compute_ms_mean),
            "padding_waste": round(self.padding_waste, 4),
            "items_per_request": num(self.items_per_request),
            "batch_cap": self.batch_cap,
            "controller": self.controller,
        }


class BreakdownObserver(Observer):
    """Collects per-model figures from batch events (batching models) and node events (the rest)."""

    def __init__(self) -> None:
        self.active = True
        self.batched: set[str] = set()  # models with a batcher (their figures come from batch events)
        self.reset()

    def bind_runners(self, runners: Mapping[str, Any]) -> None:
        """Learn which models batch (here or on a remote deployment), from the executor's runners."""
        self.batched = {name for name, runner in runners.items() if runner.batches}
        self._runners = dict(runners)

    def reset(self) -> None:
        self._since = time.monotonic()  # the controller's clock: its decisions since the reset
        self.models: dict[str, ModelBreakdown] = {}
        self.requests = 0
        self.request_items: Counter[str] = Counter()  # model items of the requests finished since reset
        self._pending: dict[str, Counter[str]] = getattr(self, "_pending", {})  # in flight: kept

    def _model(self, name: str) -> ModelBreakdown:
        if name not in self.models:
            self.models[name] = ModelBreakdown(name)
        return self.models[name]

    def batch_finished(self, event: BatchEvent) -> None:
        if not self.active or not event.ok:
            return
        self.batched.add(event.model)
        m = self._model(event.model)
        m.calls += 1
        m.items += event.items
        m.batch_sizes[event.items] += 1
        m.queue_ms_sum += float(sum(event.queue_ms))
        m.compute_ms_sum += event.compute_ms
        m.real_elements += event.real_elements
        m.padded_elements += event.padded_elements

    def node_finished(self, event: NodeEvent) -> None:
        if not self.active or event.model is None or not event.ok:
            return
        self._pending.setdefault(event.request_id, Counter())[event.model] += event.items
        if event.model in self.batched:
            return
        # models without a batcher: one backend call per item
        m = self._model(event.model)
        m.calls += event.items
        m.items += event.items
        m.batch_sizes[1] += event.items
        m.queue_ms_sum += event.queue_ms
        m.compute_ms_sum += event.compute_ms

    def request_finished(self, request_id: str, modalities: Any, seconds: float, status: str, pruned: Any) -> None:
        items = self._pending.pop(request_id, Counter())
        if self.active and status == "ok":
            self.requests += 1
            self.request_items.update(items)

    def snapshot(self) -> list[ModelBreakdown]:
        for name, m in self.models.items():
            m.requests = self.requests
            m.request_items = self.request_items.get(name, 0)
            runner = getattr(self, "_runners", {}).get(name)
            if runner is not None and hasattr(runner, "batch_cap"):
                ctl = getattr(runner, "controller", None)
                m.batch_cap = int(ctl.settled_cap if ctl is not None else runner.batch_cap)  # not a probe's
                m.controller = controller_summary(ctl, self._since)
        return [self.models[k] for k in sorted(self.models)]


def controller_summary(controller: Any, since: float) -> str:
    """One line on a batch controller: its settled cap, and its moves and probes since ``since``."""
    if controller is None:
        return "off (declared values)"
    recent = [d for d in controller.decisions if d.time >= since]
    probes = sum(1 for d in recent if d.reason.startswith("probe "))
    moves = sum(1 for d in recent if not d.reason.startswith(("probe", "start")))
    return f"on: settled cap {controller.settled_cap}, {moves} move(s), {probes} probe(s) in the run"


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text exposition → {(metric, sorted labels): value} (comments skipped)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


def breakdown_from_metrics(before: str, after: str, requests: int) -> list[ModelBreakdown]:
    """Per-model figures from two scrapes of a USG server's ``/metrics``."""
    a, b = parse_prometheus(before), parse_prometheus(after)

    def delta(metric: str) -> dict[str, float]:
        res: dict[str, float] = defaultdict(float)
        for (name, labels), value in b.items():
            if name != metric:
                continue
            lab = dict(labels)
            if "model" not in lab or "le" in lab:
                continue
            res[lab["model"]] += value - a.get((name, labels), 0.0)
        return res

    def buckets(metric: str) -> dict[str, dict[float, float]]:
        res: dict[str, dict[float, float]] = defaultdict(dict)
        for (name, labels), value in b.items():
            lab = dict(labels)
            if name != metric or "model" not in lab or "le" not in lab:
                continue
            res[lab["model"]][float(lab["le"])] = value - a.get((name, labels), 0.0)
        return res

    items = delta("usg_model_items_total")
    batch_count, batch_sum = delta("usg_batch_size_count"), delta("usg_batch_size_sum")
    q_sum = delta("usg_model_queue_wait_seconds_sum")
    c_sum, c_count = delta("usg_model_compute_seconds_sum"), delta("usg_model_compute_seconds_count")
    real, padded = delta("usg_batch_real_elements_total"), delta("usg_batch_padded_elements_total")
    size_buckets = buckets("usg_batch_size_bucket")
    models: list[ModelBreakdown] = []
    for name in sorted(set(items) | set(batch_count) | set(c_count)):
        m = ModelBreakdown(name, requests=requests)
        m.items = round(items.get(name, batch_sum.get(name, 0.0)))
        batched = batch_count.get(name, 0.0) > 0
        m.calls = round(batch_count[name]) if batched else m.items
        m.queue_ms_sum = q_sum.get(name, 0.0) * 1e3  # observed per item (batched) or per node
        m.compute_ms_sum = c_sum.get(name, 0.0) * 1e3  # observed per backend call or per node
        m.real_elements = int(real.get(name, 0.0))
        m.padded_elements = int(padded.get(name, 0.0))
        cum = sorted(size_buckets.get(name, {}).items())
        prev = 0.0
        for le, count in cum:
            n = round(count - prev)
            prev = count
            if n > 0 and np.isfinite(le):
                m.batch_sizes[int(le)] += n
        if not m.batch_sizes and m.calls:
            m.batch_sizes[1] = m.calls
        cap = b.get(("usg_batch_cap", (("model", name),)))
        m.batch_cap = None if cap is None else round(cap)
        models.append(m)
    return models
