"""Node functions around ``align:`` nodes and nested lists: pick the paired items of aligned tuples,
flatten a list of lists for a ``map`` model and group the results back, attach results per item.

With them a per-image pipeline (the OCR nodes) runs over every frame aligned with a speech segment,
each model still batching across all crops of all frames (``examples/lecture_index``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.ops.signature import ListOf, op

__all__ = ["attach", "flatten", "paired", "present", "unflatten"]


@op(outputs={"items": ListOf(), "keys": ListOf()})
def paired(tuples: Sequence[dict[str, Any]], *, key: str, partner: str, field: str | None = None) -> dict[str, Any]:
    """Of the aligned tuples that hold both ``key`` and ``partner``: ``items``, the partner items (their
    ``field`` when given, e.g. a frame's ``image``), and ``keys``, the key items, in tuple order."""
    items, keys = [], []
    for t in tuples:
        if t.get(key) is None or t.get(partner) is None:
            continue
        item = t[partner]
        if field is not None:
            if not isinstance(item, dict) or field not in item:
                raise InputError(
                    f"aligned {partner!r} item has no {field!r}", field=partner, fix=f"give {partner} items a {field!r}"
                )
            item = item[field]
        items.append(item)
        keys.append(t[key])
    return {"items": items, "keys": keys}


@op(outputs={"items": ListOf(), "counts": None})
def flatten(lists: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A list of lists → one flat list (``items``) and the length of each (``counts``, for :func:`unflatten`)."""
    return {"items": [x for sub in lists for x in sub], "counts": [len(sub) for sub in lists]}


@op(outputs={"lists": ListOf()})
def unflatten(items: Sequence[Any], counts: Sequence[int]) -> dict[str, Any]:
    """The inverse of :func:`flatten`: ``items`` cut back into lists of ``counts`` items."""
    if sum(counts) != len(items):
        raise InputError(
            f"unflatten: {len(items)} items for counts summing to {sum(counts)}",
            field="items",
            fix="wire the counts of the flatten node whose items produced these",
        )
    out, at = [], 0
    for n in counts:
        out.append(list(items[at : at + n]))
        at += n
    return {"lists": out}


@op(outputs={"rows": ListOf(), "values": ListOf()})
def attach(
    tuples: Sequence[dict[str, Any]],
    texts: Sequence[str | None] = (),
    vectors: Sequence[Any] = (),
    *,
    key: str,
    partner: str,
    drop: Sequence[str] = (),
) -> dict[str, Any]:
    """One row per aligned tuple that holds ``key`` (in time order): the key item's fields, the partner's
    capture time and the tuple's skew (or None), and ``text``: the result for the partner (``texts`` are
    the per-pair results in :func:`paired` order). ``values``: ``vectors`` per row the same way (None
    for rows without a text)."""
    rows, values = [], []
    i = j = 0
    for t in tuples:
        if t.get(key) is None:
            continue
        row = {k: v for k, v in dict(t[key]).items() if k not in drop}
        mate = t.get(partner)
        text = vec = None
        if mate is not None:
            text = texts[i] if i < len(texts) else None
            i += 1
            if text:
                vec = _row(vectors[j]) if j < len(vectors) else None
                j += 1
        row.update(
            {
                f"{partner}_ts_ms": None if mate is None else mate.get("ts_ms"),
                "skew_ms": None if mate is None else t.get("skew_ms"),
            },
            text=text,
        )
        rows.append(row)
        values.append(vec)
    return {"rows": rows, "values": values}


def _row(vector: Any) -> Any:
    """A ``[1, D]`` embedding (a model's batch of one) as ``[D]``; anything else unchanged."""
    arr = np.asarray(vector)
    return arr[0] if arr.ndim == 2 and arr.shape[0] == 1 else vector


@op(outputs={"texts": ListOf()})
def present(texts: Sequence[str | None]) -> dict[str, Any]:
    """The texts that are not None nor empty (what an embedding ``map`` node can take)."""
    return {"texts": [t for t in texts if t]}
