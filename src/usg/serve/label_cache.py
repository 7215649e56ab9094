"""Children of labelled Prometheus metrics, looked up once per label values.

``metric.labels(...)`` validates the values and takes the metric's lock on every call; the
serving path records ~15 samples per request, so :class:`LabelCache` keeps each child it made
(label values are node, model, endpoint, status-code names: a bounded set).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LabelCache"]


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
