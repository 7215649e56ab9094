"""Children of labelled Prometheus metrics, looked up once per label values.

``metric.labels(...)`` validates the values and takes the metric's lock on every call; the
serving path records ~15 samples per request, so :class:`LabelCache` keeps each child it made
(label values are node, model, endpoint, status-code names: a bounded set).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

__all__ = ["LabelCache", "observe_many"]


class LabelCache:
    """``cache(metric, *values)`` is ``metric.labels(*values)``, made once per (metric, values)."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (a labelled child), with one increment per
    bucket hit and one of the sum instead of two increments (two locks) per value: an LLM node
    records one inter-token gap per token. Falls back to ``observe`` where the client library's
    histogram is not laid out as in prometheus_client 0.20+ (``_upper_bounds``, ``_buckets``, ``_sum``)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if len(values) < 2 or bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    hits: dict[int, int] = {}
    for value in values:
        i = bisect.bisect_left(bounds, value)  # the first bucket with value <= bound, as observe finds it
        if value == value and i < len(buckets):  # NaN lands in no bucket (observe's loop finds none)
            hits[i] = hits.get(i, 0) + 1
    total.inc(sum(values))
    for i, count in hits.items():
        buckets[i].inc(count)
