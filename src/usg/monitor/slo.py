"""SLO-violation attribution: per request the critical path through the graph, its time split into
queue wait, batch wait, compute and transfer per node; in aggregate the share of the violation budget
per node and per cause.

- **Critical path** (as Jaeger's, on node spans): from the request's end, repeatedly take the node that
  finished last before the current point (among the previous node's graph upstream when the span
  lists it, as USG's trace file does), then continue from that node's start. Gaps between path
  nodes are *transfer* of the later node (hand-off, scheduling); the gaps at the request's two ends
  belong to ``(executor)``.
- **Split of a node's wall time**: model nodes: ``batch_wait`` (the batch window, ``usg.batch_wait_ms``),
  ``queue`` (the rest of the queue wait: a free instance), ``compute`` (the backend), and ``transfer``
  (the rest: input checks, hand-off to the worker thread); when the item sums of a ``map`` node exceed
  its wall time they are scaled down to it. Python nodes: compute.
- **Violation budget**: a request violates when its latency is above the SLO's threshold. Per
  (node, cause), its excess is the critical-path time above the median of the requests that meet the
  threshold; each (node, cause)'s share of the budget is its summed excess over all violating requests.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from usg.errors import UsageError
from usg.monitor.otlp import NodeSpan, RequestTrace

__all__ = ["CAUSES", "SLO", "attribute", "critical_path", "parse_slo", "split_request"]

CAUSES = ("queue", "batch_wait", "compute", "transfer")
EXECUTOR = "(executor)"
_SLO = re.compile(r"^\s*(p\d{1,2}(?:\.\d+)?|mean|max)\s*<\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$", re.IGNORECASE)
_EPS_MS = 0.5


@dataclass(frozen=True)
class SLO:
    statistic: str  # "p95", "mean", "max"
    threshold_ms: float

    def value(self, latencies: Sequence[float]) -> float:
        x = np.asarray(latencies, dtype=np.float64)
        if self.statistic == "mean":
            return float(x.mean())
        if self.statistic == "max":
            return float(x.max())
        return float(np.percentile(x, float(self.statistic[1:])))

    def __str__(self) -> str:
        return f"{self.statistic} < {self.threshold_ms:g} ms"


def parse_slo(text: str) -> SLO:
    """``"p95<800ms"``, ``"p99 < 1.5s"``, ``"mean<200ms"``, ``"max<2s"``."""
    m = _SLO.match(text)
    if not m:
        raise UsageError(f"--slo {text!r} is not an SLO; fix: write it like p95<800ms, p99<1.5s or mean<200ms")
    stat, num, unit = m.group(1).lower(), float(m.group(2)), m.group(3).lower()
    if stat.startswith("p") and not 0 < float(stat[1:]) < 100:
        raise UsageError(f"--slo {text!r}: percentile {stat[1:]} is not in (0, 100); fix: use p50 … p99.9")
    return SLO(stat, num * (1000.0 if unit == "s" else 1.0))


def critical_path(req: RequestTrace) -> list[tuple[NodeSpan, float, float]]:
    """Path nodes in time order, each with the gap (ms) between its start and the previous path node's end,
    and the part of its wall time (ms) on the path (a node that ends a hair after its successor started
    is clipped there, so the parts and gaps add up to the request's latency)."""
    cur = req.latency_ms
    chosen: list[tuple[NodeSpan, float, float]] = []  # node, clipped start, clipped end
    remaining = list(req.nodes)
    while remaining and cur > 0:
        cands = [n for n in remaining if n.end_ms <= cur + _EPS_MS]
        upstream = chosen[-1][0].upstream if chosen else None
        if upstream is not None:  # the graph's edges are known: only an upstream node can hold this one up
            cands = [n for n in cands if n.node in upstream]
        if not cands:
            break
        node = max(cands, key=lambda n: n.end_ms)
        end = min(node.end_ms, cur)
        start = min(max(0.0, node.start_ms), end)
        chosen.append((node, start, end))
        remaining = [n for n in remaining if n is not node and n.end_ms <= start + _EPS_MS]
        cur = start
    chosen.reverse()
    out: list[tuple[NodeSpan, float, float]] = []
    prev_end = None
    for n, start, end in chosen:
        out.append((n, 0.0 if prev_end is None else max(0.0, start - prev_end), end - start))
        prev_end = end
    return out


def _node_split(n: NodeSpan) -> dict[str, float]:
    wall = n.wall_ms
    if n.model is None:
        return {"compute": wall}
    q, c = max(0.0, n.queue_ms), max(0.0, n.compute_ms)
    bw = min(max(0.0, n.batch_wait_ms), q)
    if q + c > wall > 0:
        scale = wall / (q + c)
        q, c, bw = q * scale, c * scale, bw * scale
    return {"queue": q - bw, "batch_wait": bw, "compute": c, "transfer": max(0.0, wall - q - c)}


def split_request(req: RequestTrace) -> dict[tuple[str, str], float]:
    """(node, cause) → ms on the request's critical path; the values add up to its latency."""
    path = critical_path(req)
    out: dict[tuple[str, str], float] = {}

    def add(node: str, cause: str, ms: float) -> None:
        if ms > 0:
            out[(node, cause)] = out.get((node, cause), 0.0) + ms

    if not path:
        add(EXECUTOR, "transfer", req.latency_ms)
        return out
    first_start = req.latency_ms
    last_end = 0.0
    for n, gap, part in path:
        add(n.node, "transfer", gap)
        scale = part / n.wall_ms if n.wall_ms > 0 else 0.0
        for cause, ms in _node_split(n).items():
            add(n.node, cause, ms * scale)
        first_start = min(first_start, min(max(0.0, n.start_ms), n.end_ms))
        last_end = max(last_end, min(n.end_ms, req.latency_ms))
    # the request's two ends: before the first path node started, after the last one ended
    add(EXECUTOR, "transfer", first_start + max(0.0, req.latency_ms - last_end))
    return out


def _shares(values: dict[tuple[str, str], float]) -> dict[str, Any]:
    total = sum(values.values())
    per_node: dict[str, float] = {}
    per_cause: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
    for (node, cause), v in values.items():
        per_node[node] = per_node.get(node, 0.0) + v
        per_cause[cause] = per_cause.get(cause, 0.0) + v

    def norm(d: dict[str, float]) -> dict[str, float]:
        return {k: (v / total if total else 0.0) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

    return {
        "total_ms": total,
        "per_node": norm(per_node),
        "per_cause": norm(per_cause),
        "per_node_cause_ms": {f"{n}/{c}": v for (n, c), v in sorted(values.items(), key=lambda kv: -kv[1])},
    }


def attribute(requests: Sequence[RequestTrace], slo: SLO, *, worst: int = 10) -> dict[str, Any]:
    """The attribution report's data (JSON-able)."""
    if not requests:
        raise UsageError("no requests in the traces; fix: pass trace files with usg.request spans")
    latencies = [r.latency_ms for r in requests]
    splits = [split_request(r) for r in requests]
    bad = [i for i, r in enumerate(requests) if r.latency_ms > slo.threshold_ms]
    bad_set = set(bad)
    good = [i for i in range(len(requests)) if i not in bad_set]
    keys = {k for s in splits for k in s}
    baseline = {k: float(np.median([splits[i].get(k, 0.0) for i in good])) if good else 0.0 for k in keys}
    excess: dict[tuple[str, str], float] = {}
    path_time: dict[tuple[str, str], float] = {}
    for i in bad:
        for k, v in splits[i].items():
            path_time[k] = path_time.get(k, 0.0) + v
            d = max(0.0, v - baseline[k])
            if d > 0:
                excess[k] = excess.get(k, 0.0) + d
    value = slo.value(latencies)
    order = sorted(range(len(requests)), key=lambda i: -requests[i].latency_ms)[:worst]
    return {
        "slo": str(slo),
        "statistic": slo.statistic,
        "threshold_ms": slo.threshold_ms,
        "value_ms": value,
        "met": value < slo.threshold_ms,
        "requests": len(requests),
        "violating": len(bad),
        "budget": _shares(excess),
        "critical_path_time": _shares(path_time),
        "baseline_ms": {f"{n}/{c}": v for (n, c), v in sorted(baseline.items()) if v > 0},
        "latencies_ms": latencies,
        "worst": [
            {
                "request_id": requests[i].request_id,
                "trace_id": requests[i].trace_id,
                "latency_ms": requests[i].latency_ms,
                "status": requests[i].status,
                "critical_path": [n.node for n, _, _ in critical_path(requests[i])],
                "split_ms": {f"{n}/{c}": v for (n, c), v in sorted(splits[i].items(), key=lambda kv: -kv[1])},
            }
            for i in order
        ],
    }
