"""The records the runtime hands to observers: what one item, one backend call and one node cost.

A ground-floor module (it imports nothing of USG), so backends, runners, the Ray replicas,
metrics and the benchmark breakdown all name the same types without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BatchEvent", "CacheEvent", "EngineCall", "ItemTiming", "NodeEvent"]


@dataclass(frozen=True)
class EngineCall:
    """One HTTP request a ``backend: openai`` model sent to its generation engine (one per
    attempt: a retried 429 is a call too), for metrics and spans. Times are ``perf_counter()``."""

    model: str
    url: str
    engine_request_id: str  # the engine's id (its X-Request-Id header, else the completion's id)
    status: int  # the engine's HTTP status; 0 when it never answered (down, timed out)
    start: float
    end: float
    first_token: float | None = None  # arrival of the first content delta
    token_gaps_s: tuple[float, ...] = ()  # between consecutive content deltas
    prompt_tokens: int | None = None  # as the engine reports them (usage), else None
    completion_tokens: int = 0  # the engine's usage, else the content deltas counted
    finish_reason: str | None = None
    error: str | None = None  # why the call failed (engine status, cut-off or malformed stream)


@dataclass
class ItemTiming:
    """Where an item's time went: waiting for a batch slot, and inside the backend; a generation
    engine's calls for it (``backend: openai``)."""

    queue_ms: float = 0.0
    compute_ms: float = 0.0
    batch_size: int = 1
    engine_calls: list[EngineCall] = field(default_factory=list)


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
    #: CPU time of the call's thread, when the backend does all its work there
    #: (:attr:`usg.backends.base.Backend.cpu_in_caller`); None otherwise
    cpu_ms: float | None = None


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
    engine_calls: tuple[EngineCall, ...] = ()  # an LLM node's requests to its engine


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
