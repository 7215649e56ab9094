"""What a model replica sends back to the router for one item.

The item's outputs (or the USG error that item caused, so the router re-raises the original
type), and the batches that this item was the first of: one
:class:`usg.records.BatchEvent` per backend call, reported once per call, so the
router's ``/metrics`` (``usg_batch_size``, queue wait, compute, padding waste) and
``usg bench``'s breakdown describe replica batching as they describe in-process batching;
and the item's own compute time, so a trace separates the hop from the model. An engine model
(``backend: openai`` with its own deployment) also sends the engine requests it made
(:class:`usg.records.EngineCall`, times on the replica's ``perf_counter()`` clock, read at
``clock`` when the reply was made) for the router's LLM metrics and spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from usg.errors import USGError
from usg.records import BatchEvent, EngineCall

__all__ = ["ReplicaReply"]


@dataclass(frozen=True)
class ReplicaReply:
    outputs: dict[str, Any] | USGError
    batches: tuple[BatchEvent, ...] = ()
    compute_ms: float = 0.0  # the backend call that ran this item (its whole batch)
    batch_size: int = 1
    engine_calls: tuple[EngineCall, ...] = ()
    clock: float = 0.0  # the replica's perf_counter() when it made this reply
