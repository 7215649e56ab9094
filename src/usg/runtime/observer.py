"""Hooks the executor calls as requests and nodes run (metrics and tracing plug in here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from usg.records import BatchEvent, CacheEvent, NodeEvent

__all__ = ["CacheEvent", "NodeEvent", "Observer"]


class Observer:
    """Base observer: every hook is a no-op. Hooks run on the event loop; keep them cheap."""

    def request_started(self, request_id: str, modalities: Sequence[str]) -> None:
        return None

    def request_integrity(self, request_id: str, integrity: Mapping[str, str]) -> None:
        """The SHA-256 of each input as received (``{INPUT: "sha256:<hex>"}``), right after ``request_started``."""
        return None

    def node_finished(self, event: NodeEvent) -> None:
        return None

    def batch_finished(self, event: BatchEvent) -> None:
        """A batcher made one backend call (size, padding, queue waits, compute)."""
        return None

    def request_values(
        self, request_id: str, inputs: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any] | None]
    ) -> None:
        """A request's decoded inputs and every node's outputs (None: skipped), before the result is built.
        Read-only: do not mutate or copy here (the drift monitor queues references for a worker thread)."""

    def cache_event(self, event: CacheEvent) -> None:
        """A cached node was looked up, served or stored (see :class:`usg.records.CacheEvent`)."""
        return None

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        return None
