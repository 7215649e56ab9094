"""The records the runtime hands to observers: what one item, one backend call and one node cost.

A ground-floor module (it imports nothing of USG), so backends, runners, the Ray replicas,
metrics and the benchmark breakdown all name the same types without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchEvent", "CacheEvent", "ItemTiming", "NodeEvent"]


@dataclass
class ItemTiming:
    """Where an item's time went: waiting for a batch slot, and inside the backend."""

    queue_ms: float = 0.0
    compute_ms: float = 0.0
    batch_size: int = 1


@dataclass(frozen=True)
class BatchEvent:
    """One backend call made by a batcher (in-process or in a Ray replica), for metrics."""

    model: str
    items: int
    rows: int
    real_elements: int
    padded_elements: int
    queue_ms: tuple[float, ...]
    compute_ms: float
    ok: bool


@dataclass(frozen=True)
class NodeEvent:
    """One node of one request ran (or failed)."""

    request_id: str
    node: str
    kind: str  # "model" | "fn"
    model: str | None
    start: float  # time.perf_counter() at start
    end: float
    queue_ms: float  # summed over items for map nodes
    compute_ms: float
    items: int
    ok: bool


@dataclass(frozen=True)
class CacheEvent:
    """One node-cache step: ``outcome`` is hit | miss | coalesced (served by a concurrent
    identical request) | store | error (a value that did not decode, or a store fault)."""

    node: str
    store: str  # "memory" | "redis"
    outcome: str
    seconds: float  # hit: lookup + decode; store: encode + write
    nbytes: int = 0
    bytes_held: int = 0  # the store's size after the step (memory store; 0 for redis)
    evictions: int = 0  # the store's evictions so far
