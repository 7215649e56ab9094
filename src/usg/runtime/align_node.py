"""The node function behind ``align:`` nodes: lists of timestamped items in, aligned tuples out.

In a request every stream is a list: items that are mappings with a capture time (``ts_ms``, else
``start_ms``, or the key ``time_keys`` names), such as VAD ``segments`` ``{start_ms, end_ms}`` or
timestamped frames ``{image, ts_ms}``. They are pushed into an :class:`~usg.runtime.align.AlignBuffer`
and flushed. Output ``tuples``: one mapping per tuple, ``{STREAM: item or None, ..., "ts_ms",
"skew_ms", "missing": [STREAM, ...]}`` in time order; ``report``: the run's counts
(:meth:`AlignStats.to_dict`; the serving metrics read it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from usg.errors import InputError
from usg.runtime.align import AlignBuffer, AlignStats, OnMissing

__all__ = ["align_streams", "item_time"]

_DEFAULT_KEYS = ("ts_ms", "start_ms")


def item_time(stream: str, index: int, item: Any, key: str | None = None) -> float:
    """The capture time (ms) of one item of ``stream``: ``item[key]``, else ``ts_ms``, else ``start_ms``."""
    keys = (key,) if key else _DEFAULT_KEYS
    if isinstance(item, Mapping):
        for k in keys:
            value = item.get(k)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    raise InputError(
        f"{stream}[{index}]: no capture time ({' or '.join(keys)}) in {type(item).__name__} item",
        field=stream,
        fix=f"give every item of {stream!r} a number {keys[0]} (milliseconds on the capture clock)",
    )


def align_streams(
    *,
    streams: Sequence[str],
    tolerance_ms: float = 300.0,
    max_wait_ms: float = 500.0,
    on_missing: OnMissing = "partial",
    time_keys: Mapping[str, str] | None = None,
    **lists: Any,
) -> dict[str, Any]:
    """Align the lists of ``streams`` (keyword arguments by stream name) → ``tuples`` and ``report``."""
    keys = dict(time_keys or {})
    stats = AlignStats(tuple(streams))
    buf = AlignBuffer(
        streams,
        tolerance_ms=tolerance_ms,
        max_wait_ms=max_wait_ms,
        on_missing=on_missing,
        stats=stats,
        max_pending=max(1, sum(len(v) for v in lists.values() if isinstance(v, Sequence))),
    )
    for s in streams:
        items = lists.get(s)
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
            raise InputError(
                f"align: stream {s!r} is a {type(items).__name__}, not a list of timestamped items",
                field=s,
                fix=f"wire {s!r} to a list (e.g. vad.segments, or a graph input with timestamped: true)",
            )
        for i, item in enumerate(items):
            buf.push(s, item_time(s, i, item, keys.get(s)), item)
    tuples = []
    for t in buf.flush():
        row: dict[str, Any] = {s: t.items.get(s) for s in streams}
        row.update(ts_ms=t.ts_ms, skew_ms=t.skew_ms, missing=list(t.missing))
        tuples.append(row)
    return {"tuples": tuples, "report": stats.to_dict()}
