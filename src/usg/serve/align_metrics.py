"""Prometheus metrics of a graph's ``align:`` nodes, read from each request's align ``report``.

``usg_align_skew_seconds{node}``: latest minus earliest capture time of each tuple of two items or
more; ``usg_align_tuples_total{node}``: decided tuples (emitted or dropped);
``usg_align_missing_total{node,stream}``: tuples that lacked the stream, so the modality-missing rate
is ``rate(usg_align_missing_total) / rate(usg_align_tuples_total)``; ``usg_align_late_items_total``
and ``usg_align_dropped_items_total`` by node and stream. A streaming session feeds the same
metrics with :meth:`AlignMetrics.record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from usg.graph import Graph
from usg.runtime.observer import Observer

__all__ = ["AlignMetrics"]

_SKEW = (0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class AlignMetrics(Observer):
    """Skew histogram, tuples, missing / late / dropped counts of every align node of ``graph``."""

    def __init__(self, registry: CollectorRegistry, graph: Graph) -> None:
        self.nodes = [n for n, d in graph.nodes.items() if d.align is not None]
        r = registry
        self.skew = Histogram(
            "usg_align_skew_seconds", "Capture-time skew within an aligned tuple.", ["node"], buckets=_SKEW, registry=r
        )
        self.tuples = Counter("usg_align_tuples", "Tuples an align node decided.", ["node"], registry=r)
        self.missing = Counter(
            "usg_align_missing", "Aligned tuples that lacked a stream (a modality).", ["node", "stream"], registry=r
        )
        self.late = Counter(
            "usg_align_late_items", "Items that arrived after their alignment window.", ["node", "stream"], registry=r
        )
        self.dropped = Counter(
            "usg_align_dropped_items", "Items dropped with an incomplete tuple.", ["node", "stream"], registry=r
        )

    def record(self, node: str, report: Mapping[str, Any]) -> None:
        """Add one run's counts (:meth:`usg.runtime.align.AlignStats.to_dict`) to the metrics of ``node``."""
        self.tuples.labels(node).inc(report.get("tuples", 0))
        for stream, n in report.get("missing", {}).items():
            self.missing.labels(node, stream).inc(n)
        for stream, n in report.get("late", {}).items():
            self.late.labels(node, stream).inc(n)
        for stream, n in report.get("dropped", {}).items():
            self.dropped.labels(node, stream).inc(n)
        hist = self.skew.labels(node)
        for ms in report.get("skews_ms", ()):
            hist.observe(ms / 1e3)

    def request_values(
        self, request_id: str, inputs: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any] | None]
    ) -> None:
        for name in self.nodes:
            out = nodes.get(name)
            report = out.get("report") if out is not None else None
            if isinstance(report, Mapping):
                self.record(name, report)
