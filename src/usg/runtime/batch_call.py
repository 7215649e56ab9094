"""Run a list of items of one model as few backend calls as their shapes allow.

Used where something else collected the items (Ray Serve's ``@serve.batch``): items that may
share a batch (:func:`usg.runtime.padding.group_key`) are assembled, padded where the model
declares it, run in one call and split back; a failing call is split and retried so only the
failing items fail (the same poison isolation as :class:`usg.runtime.batcher.BatchingRunner`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from usg.backends.base import Backend
from usg.errors import BackendError
from usg.graph.model import PadPolicy
from usg.runtime.padding import assemble, group_key, item_length, split_outputs
from usg.runtime.runner import call_backend

__all__ = ["run_items"]


def run_items(
    backend: Backend, model: str, items: Sequence[Mapping[str, Any]], pad: PadPolicy | None
) -> tuple[list[dict[str, Any] | BackendError], int]:
    """Per item, its outputs or the BackendError that item alone caused (in input order), and
    the number of backend calls made."""
    results: list[dict[str, Any] | BackendError] = [BackendError(f"model {model!r}: item not run")] * len(items)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in sorted(range(len(items)), key=lambda i: item_length(items[i], pad)):
        groups.setdefault(group_key(items[i], pad), []).append(i)
    calls = sum(_run(backend, model, items, idx, pad, results) for idx in groups.values())
    return results, calls


def _run(
    backend: Backend,
    model: str,
    items: Sequence[Mapping[str, Any]],
    idx: list[int],
    pad: PadPolicy | None,
    results: list[dict[str, Any] | BackendError],
) -> int:
    chosen = [items[i] for i in idx]
    try:
        inputs, _, _ = assemble(chosen, pad)
        parts = split_outputs(call_backend(backend, model, inputs), chosen, pad, inputs)
    except Exception as exc:
        if len(idx) == 1:
            results[idx[0]] = exc if isinstance(exc, BackendError) else BackendError(f"model {model!r}: {exc}")
            return 1
        mid = len(idx) // 2
        return (
            1
            + _run(backend, model, items, idx[:mid], pad, results)
            + _run(backend, model, items, idx[mid:], pad, results)
        )
    for i, part in zip(idx, parts, strict=True):
        results[i] = part
    return 1
