"""Run a list of items of one model as few backend calls as their shapes allow.

Used where something else collected the items (Ray Serve's ``@serve.batch``): items that may
share a batch (:func:`usg.runtime.padding.group_key`) are assembled, padded where the model
declares it, run in one call and split back; a failing call is split and retried so only the
failing items fail (the same poison isolation as :class:`usg.runtime.batcher.BatchingRunner`).
Each backend call is described by a :class:`usg.records.BatchEvent`, the record the
in-process batcher gives metrics, so both engines report batches the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from usg.backends.base import Backend
from usg.errors import BackendError
from usg.graph.model import PadPolicy
from usg.records import BatchEvent
from usg.runtime.padding import assemble, group_key, item_length, item_rows, split_outputs
from usg.runtime.runner import call_backend

__all__ = ["ItemsCall", "run_items"]


@dataclass(frozen=True)
class ItemsCall:
    """One backend call: which items (indices into the list given) it ran, and its event."""

    indices: tuple[int, ...]
    event: BatchEvent


def run_items(
    backend: Backend,
    model: str,
    items: Sequence[Mapping[str, Any]],
    pad: PadPolicy | None,
    queue_ms: Sequence[float] | None = None,
) -> tuple[list[dict[str, Any] | BackendError], list[ItemsCall]]:
    """Per item, its outputs or the BackendError that item alone caused (in input order), and
    the backend calls made (``queue_ms``: each item's wait before this run, for the events)."""
    results: list[dict[str, Any] | BackendError] = [BackendError(f"model {model!r}: item not run")] * len(items)
    waits = list(queue_ms) if queue_ms is not None else [0.0] * len(items)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in sorted(range(len(items)), key=lambda i: item_length(items[i], pad)):
        groups.setdefault(group_key(items[i], pad), []).append(i)
    calls: list[ItemsCall] = []
    for idx in groups.values():
        _run(backend, model, items, idx, pad, results, waits, calls)
    return results, calls


def _run(
    backend: Backend,
    model: str,
    items: Sequence[Mapping[str, Any]],
    idx: list[int],
    pad: PadPolicy | None,
    results: list[dict[str, Any] | BackendError],
    waits: list[float],
    calls: list[ItemsCall],
) -> None:
    chosen = [items[i] for i in idx]
    real = padded = 0
    t0 = time.perf_counter()
    try:
        inputs, real, padded = assemble(chosen, pad)
        parts = split_outputs(call_backend(backend, model, inputs), chosen, pad, inputs)
    except Exception as exc:
        calls.append(_call(model, chosen, idx, real, padded, waits, t0, ok=False))
        if len(idx) == 1:
            results[idx[0]] = exc if isinstance(exc, BackendError) else BackendError(f"model {model!r}: {exc}")
            return
        mid = len(idx) // 2
        _run(backend, model, items, idx[:mid], pad, results, waits, calls)
        _run(backend, model, items, idx[mid:], pad, results, waits, calls)
        return
    calls.append(_call(model, chosen, idx, real, padded, waits, t0, ok=True))
    for i, part in zip(idx, parts, strict=True):
        results[i] = part


def _call(
    model: str,
    chosen: list[Mapping[str, Any]],
    idx: list[int],
    real: int,
    padded: int,
    waits: list[float],
    t0: float,
    *,
    ok: bool,
) -> ItemsCall:
    event = BatchEvent(
        model,
        len(idx),
        sum(item_rows(it) for it in chosen),
        real,
        padded,
        tuple(waits[i] for i in idx),
        (time.perf_counter() - t0) * 1e3,
        ok,
    )
    return ItemsCall(tuple(idx), event)
