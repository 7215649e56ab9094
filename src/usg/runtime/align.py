"""A timestamp-aligned join of several streams: :class:`AlignBuffer` pairs items by capture time.

Items are pushed one at a time (``push(stream, ts_ms, item, now_ms)``) in any order and
:meth:`AlignBuffer.poll` returns the tuples it can decide at ``now_ms``; :meth:`AlignBuffer.flush`
decides everything left (the end of a request or of a session). Nothing assumes a request: a
streaming session feeds it chunk by chunk with its clock, a request pushes whole lists and flushes.

Rules (``tolerance_ms`` T, ``max_wait_ms`` W; ``now_ms`` is on the capture clock of ``ts_ms``):

- The earliest pending item is the *anchor*. From each other stream it takes the earliest pending
  item within T of it, unless that item is closer to another pending item of the anchor's stream
  (mutual nearest, so a dense stream does not steal a sparse stream's partner). Every item of a
  tuple is within T of the anchor, so a tuple's skew (latest minus earliest) is at most T.
- A complete tuple goes out at once (when the anchor's stream cannot still send a closer item, read
  from its watermark); a tuple with a stream missing waits until ``anchor.ts + T + W``: an item that
  arrives within W of its capture time is never missed. Then it goes out with a ``missing`` list
  (``on_missing: partial``), or is dropped and counted (``on_missing: drop``).
- Tuples leave in anchor order. An item pushed after ``ts + T + W`` is *late* (counted; it still
  joins what is pending). At most ``max_pending`` items wait; past that the oldest are decided early.

:class:`AlignStats` counts pushed, late and dropped items per stream, tuples, how often each stream
was missing, and the skews (the serving metrics read it: :meth:`AlignStats.missing_rate`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from usg.errors import InputError, UsageError

__all__ = ["AlignBuffer", "AlignStats", "Aligned", "OnMissing"]

OnMissing = Literal["partial", "drop"]


@dataclass(frozen=True)
class Aligned:
    """One decided tuple: the items by stream (present streams only), their times, what is missing."""

    ts_ms: float  # the anchor's (earliest item's) capture time
    items: Mapping[str, Any]
    times: Mapping[str, float]
    missing: tuple[str, ...]

    @property
    def skew_ms(self) -> float:
        """Latest minus earliest capture time of the items (0 with one item)."""
        return max(self.times.values()) - min(self.times.values())


@dataclass
class AlignStats:
    """Counters of one buffer (or of one request's run): per stream pushed / late / dropped items and
    how many decided tuples lacked it; ``skews_ms`` of every tuple with two items or more."""

    streams: tuple[str, ...]
    tuples: int = 0  # decided tuples (emitted and dropped)
    dropped_tuples: int = 0
    pushed: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    skews_ms: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        for counts in (self.pushed, self.late, self.dropped, self.missing):
            for s in self.streams:
                counts.setdefault(s, 0)

    def missing_rate(self, stream: str) -> float:
        """Share of decided tuples that lacked ``stream`` (0.0 before any tuple)."""
        return self.missing[stream] / self.tuples if self.tuples else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain counts (JSON-able): tuples, dropped_tuples, pushed / late / dropped / missing by stream, skews_ms."""
        return {
            "tuples": self.tuples,
            "dropped_tuples": self.dropped_tuples,
            "pushed": dict(self.pushed),
            "late": dict(self.late),
            "dropped": dict(self.dropped),
            "missing": dict(self.missing),
            "skews_ms": list(self.skews_ms),
        }

    def drain_skews(self) -> list[float]:
        """The skews recorded since the last drain (a long session keeps this list short)."""
        out, self.skews_ms = self.skews_ms, []
        return out


@dataclass(order=True)
class _Entry:
    ts: float
    seq: int
    stream: str = field(compare=False)
    item: Any = field(compare=False)


class AlignBuffer:
    """Pairs items of ``streams`` by capture time within ``tolerance_ms`` (see the module docstring)."""

    def __init__(
        self,
        streams: Sequence[str],
        *,
        tolerance_ms: float = 300.0,
        max_wait_ms: float = 500.0,
        on_missing: OnMissing = "partial",
        max_pending: int = 10_000,
        stats: AlignStats | None = None,
    ) -> None:
        if len(streams) < 2 or len(set(streams)) != len(streams):
            raise UsageError(f"an align buffer needs two or more distinct streams, got {list(streams)}")
        if tolerance_ms < 0 or max_wait_ms < 0 or max_pending < 1:
            raise UsageError(
                f"tolerance_ms {tolerance_ms} / max_wait_ms {max_wait_ms} / max_pending {max_pending}: "
                "use non-negative times and max_pending >= 1"
            )
        if on_missing not in ("partial", "drop"):
            raise UsageError(f"on_missing is {on_missing!r}; use 'partial' or 'drop'")
        self.streams = tuple(streams)
        self.tolerance_ms = float(tolerance_ms)
        self.max_wait_ms = float(max_wait_ms)
        self.on_missing = on_missing
        self.max_pending = max_pending
        self.stats = stats or AlignStats(self.streams)
        self._pending: dict[str, list[_Entry]] = {s: [] for s in self.streams}
        self._watermark: dict[str, float] = {s: float("-inf") for s in self.streams}
        self._ready: list[Aligned] = []
        self._seq = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        """Items waiting to be decided."""
        return self._count

    def push(self, stream: str, ts_ms: float, item: Any, now_ms: float | None = None) -> None:
        """Add ``item`` of ``stream`` captured at ``ts_ms`` (``now_ms``: arrival, to count it late)."""
        if stream not in self._pending:
            raise InputError(
                f"align: unknown stream {stream!r}", field=stream, fix=f"use one of: {', '.join(self.streams)}"
            )
        ts = float(ts_ms)
        if ts != ts or ts in (float("inf"), float("-inf")):
            raise InputError(f"{stream}: timestamp {ts_ms!r} is not finite", field=stream, fix="send ts_ms in ms")
        self.stats.pushed[stream] += 1
        if now_ms is not None and now_ms > ts + self.tolerance_ms + self.max_wait_ms:
            self.stats.late[stream] += 1
        bisect.insort(self._pending[stream], _Entry(ts, next(self._seq), stream, item))
        self._watermark[stream] = max(self._watermark[stream], ts)
        self._count += 1
        while self._count > self.max_pending:  # bounded: decide the oldest now
            self._decide_head(force=True, now_ms=float("inf"))

    def poll(self, now_ms: float) -> list[Aligned]:
        """The tuples decided by ``now_ms`` (in anchor order); later items stay pending."""
        while self._count and self._decide_head(force=False, now_ms=now_ms):
            pass
        out, self._ready = self._ready, []
        return out

    def flush(self) -> list[Aligned]:
        """Decide every pending item (end of the request or session)."""
        while self._count:
            self._decide_head(force=True, now_ms=float("inf"))
        out, self._ready = self._ready, []
        return out

    # -- internals ---------------------------------------------------------------------------
    def _head(self) -> _Entry:
        return min(q[0] for q in self._pending.values() if q)

    def _partner(self, anchor: _Entry, stream: str) -> _Entry | None:
        """The earliest item of ``stream`` within tolerance of the anchor, if the anchor is its nearest."""
        queue = self._pending[stream]
        if not queue or queue[0].ts - anchor.ts > self.tolerance_ms:
            return None
        cand = queue[0]
        own = self._pending[anchor.stream]
        i = bisect.bisect_left(own, _Entry(cand.ts, -1, "", None))
        closer = [e for e in own[max(1, i - 1) : i + 1] if e is not anchor]
        if any(abs(e.ts - cand.ts) < cand.ts - anchor.ts for e in closer):
            return None  # another item of the anchor's stream is nearer to it
        return cand

    def _decide_head(self, *, force: bool, now_ms: float) -> bool:
        """Decide the tuple of the earliest item if its time has come; False when it must wait."""
        anchor = self._head()
        deadline = anchor.ts + self.tolerance_ms + self.max_wait_ms
        due = force or now_ms >= deadline
        chosen = {anchor.stream: anchor}
        for s in self.streams:
            if s != anchor.stream:
                partner = self._partner(anchor, s)
                if partner is not None:
                    chosen[s] = partner
        if not due:
            if len(chosen) < len(self.streams):
                return False  # a missing stream may still send its item
            reach = max(2 * e.ts - anchor.ts for e in chosen.values())
            if self._watermark[anchor.stream] < reach:
                return False  # the anchor's stream may still send an item nearer to a partner
        for s, e in chosen.items():
            self._pending[s].remove(e)
        self._count -= len(chosen)
        self._emit(anchor.ts, chosen)
        return True

    def _emit(self, ts: float, chosen: Mapping[str, _Entry]) -> None:
        missing = tuple(s for s in self.streams if s not in chosen)
        st = self.stats
        st.tuples += 1
        for s in missing:
            st.missing[s] += 1
        if len(chosen) > 1:
            times = [e.ts for e in chosen.values()]
            st.skews_ms.append(max(times) - min(times))
        if missing and self.on_missing == "drop":
            st.dropped_tuples += 1
            for s in chosen:
                st.dropped[s] += 1
            return
        order = [s for s in self.streams if s in chosen]
        self._ready.append(Aligned(ts, {s: chosen[s].item for s in order}, {s: chosen[s].ts for s in order}, missing))
