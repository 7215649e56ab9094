"""How items of one model become one batch and back: grouping keys, padding, budgets, splitting.

An item maps port → array with a leading batch axis (often 1 row), or port → list of
strings. Without a pad policy only items whose arrays have identical shapes (past axis 0)
and dtypes share a batch. With one, the declared axes may differ and are padded.

A 0-d array (silero-vad's ``sr``) is one value for the whole call: only items with equal values
share a batch, and the call gets it once. A stateful model's state inputs (:class:`StateSpec`)
are stacked on their declared batch axis (silero's ``[2, batch, 128]``: axis 1), and its state
outputs split back on it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from usg.graph.model import PadPolicy
from usg.graph.state import StateSpec

__all__ = ["assemble", "group_key", "item_length", "item_rows", "next_size", "padded_elements", "split_outputs"]


def _axes(pad: PadPolicy | None, port: str) -> tuple[int, ...]:
    if pad is None:
        return ()
    return pad.axes.get(port, pad.axes.get("*", ()))


def next_size(size: int, pad: PadPolicy) -> int:
    """The padded size for ``size``: the next bucket, else the next multiple, else unchanged."""
    if pad.buckets:
        i = bisect.bisect_left(pad.buckets, size)
        if i < len(pad.buckets):
            return pad.buckets[i]
    if pad.multiple:
        return int(math.ceil(size / pad.multiple) * pad.multiple)
    return size


def group_key(item: Mapping[str, Any], pad: PadPolicy | None) -> tuple[Any, ...]:
    """Items with equal keys may share a batch (computed per item queued: kept lean — dtype objects,
    not their names, which numpy builds anew on every read)."""
    key: list[Any] = []
    for port in sorted(item):
        v = item[port]
        if isinstance(v, np.ndarray):
            shape = v.shape
            if not shape:
                key.append((port, v.dtype, v.item()))
                continue
            axes = _axes(pad, port) if pad is not None else ()
            dims = tuple(-1 if (a in axes) else d for a, d in enumerate(shape) if a > 0) if axes else shape[1:]
            key.append((port, v.dtype, dims))  # dims: one per axis past the batch axis, so the rank too
        else:
            key.append((port, "list"))
    return tuple(key)


def item_length(item: Mapping[str, Any], pad: PadPolicy | None) -> int:
    """The item's size along its padded axes (product), used to order items by length."""
    if pad is None:
        # without padding, order by total size so similar items are adjacent
        total = 0
        for v in item.values():
            if isinstance(v, np.ndarray):
                total += v.size
        return total
    for port, v in sorted(item.items()):
        axes = _axes(pad, port)
        if axes and isinstance(v, np.ndarray):
            return int(np.prod([v.shape[a] for a in axes]))
    return 0


def _target_shape(arrays: Sequence[np.ndarray], axes: tuple[int, ...], pad: PadPolicy | None) -> list[int]:
    shape = list(arrays[0].shape[1:])
    for a in axes:
        biggest = max(x.shape[a] for x in arrays)
        shape[a - 1] = next_size(biggest, pad) if pad is not None else biggest
    return shape


def padded_elements(items: Sequence[Mapping[str, Any]], pad: PadPolicy) -> int:
    """Rows × padded extent along the padded axes of the first padded input (tokens or pixels)."""
    for port in sorted(items[0]):
        axes = _axes(pad, port)
        if axes and isinstance(items[0][port], np.ndarray):
            arrays = [it[port] for it in items]
            shape = _target_shape(arrays, axes, pad)
            extent = int(np.prod([shape[a - 1] for a in axes]))
            return sum(int(x.shape[0]) for x in arrays) * extent
    return 0


def assemble(
    items: Sequence[Mapping[str, Any]], pad: PadPolicy | None, state: StateSpec | None = None
) -> tuple[dict[str, Any], int, int]:
    """Concatenate items into one batch; returns (inputs, real elements, padded elements)."""
    out: dict[str, Any] = {}
    real = padded = 0
    for port in items[0]:
        values = [it[port] for it in items]
        if not isinstance(values[0], np.ndarray):
            merged: list[Any] = []
            for v in values:
                merged.extend(v)
            out[port] = merged
            continue
        if values[0].ndim == 0:  # one value per call (group_key keeps unequal ones apart)
            out[port] = values[0]
            continue
        if state is not None and port in state.pairs:
            out[port] = values[0] if len(values) == 1 else np.concatenate(values, axis=state.batch_axis)
            continue
        axes = _axes(pad, port)
        if not axes or (len(values) == 1 and pad is None):
            out[port] = values[0] if len(values) == 1 else np.concatenate(values, axis=0)
            n = sum(v.size for v in values)
            real += n
            padded += n
            continue
        shape = _target_shape(values, axes, pad)
        fill = pad.value.get(port, pad.value.get("*", 0.0)) if pad is not None else 0.0
        rows = sum(int(v.shape[0]) for v in values)
        batch = np.full([rows, *shape], fill, dtype=values[0].dtype)
        r = 0
        for v in values:
            index = (slice(r, r + v.shape[0]), *(slice(0, d) for d in v.shape[1:]))
            batch[index] = v
            r += v.shape[0]
            real += v.size
        padded += batch.size
        out[port] = batch
    return out, real, padded


def item_rows(item: Mapping[str, Any], state: StateSpec | None = None) -> int:
    """How many batch rows an item carries (axis 0 of its first array, or its list length;
    state inputs and 0-d arrays do not count)."""
    for port, v in item.items():
        if state is not None and port in state.pairs:
            continue
        if isinstance(v, np.ndarray) and v.ndim:
            return int(v.shape[0])
        if isinstance(v, list):
            return len(v)
    return 1


def split_outputs(
    outputs: Mapping[str, Any],
    items: Sequence[Mapping[str, Any]],
    pad: PadPolicy | None,
    inputs: Mapping[str, Any],
    state: StateSpec | None = None,
    rows: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Cut batch outputs back into per-item outputs (rows, and padded axes where a trim rule says;
    state outputs on the state's batch axis). ``rows``: each item's :func:`item_rows`, if known."""
    if rows is None:
        rows = [item_rows(it, state) for it in items]
    total = sum(rows)
    parts: list[dict[str, Any]] = [{} for _ in items]
    for name, value in outputs.items():
        arr = np.asarray(value)
        if state is not None and name in state.outputs:
            _split_state(name, arr, rows, state.batch_axis, parts)
            continue
        if arr.ndim == 0 or arr.shape[0] != total:
            raise ValueError(
                f"batched output {name!r} has {arr.shape[0] if arr.ndim else 0} rows for a batch of {total}; "
                "the model must preserve the batch size on axis 0"
            )
        trims = pad.trim.get(name, {}) if pad is not None else {}
        r = 0
        for i, (it, n) in enumerate(zip(items, rows, strict=True)):
            piece = arr[r : r + n]
            for out_axis, (src, in_axis, div) in trims.items():
                src_v = it.get(src)
                if isinstance(src_v, np.ndarray):
                    keep = math.ceil(src_v.shape[in_axis] / div)
                    index = [slice(None)] * piece.ndim
                    index[out_axis] = slice(0, keep)
                    piece = piece[tuple(index)]
            parts[i][name] = piece
            r += n
    return parts


def _split_state(name: str, arr: np.ndarray, rows: Sequence[int], axis: int, parts: list[dict[str, Any]]) -> None:
    total = sum(rows)
    if arr.ndim <= axis or arr.shape[axis] != total:
        got = arr.shape[axis] if arr.ndim > axis else None
        raise ValueError(
            f"state output {name!r} {list(arr.shape)} has {got} rows on batch_axis {axis} for a batch of {total}; "
            "the model must keep the batch on the declared state batch_axis"
        )
    lead = (slice(None),) * axis
    r = 0
    for part, n in zip(parts, rows, strict=True):
        part[name] = arr[(*lead, slice(r, r + n))].copy()  # a copy: a stream's state must not hold the batch's
        r += n
