"""Per-session limits of streaming sessions (:mod:`usg.stream`), with their defaults.

``usg serve --stream-limit KEY=VALUE`` (repeatable) sets them for ``WS /v1/stream/{graph}``;
the Python API takes a :class:`SessionLimits`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from usg.errors import UsageError

__all__ = ["SessionLimits"]


@dataclass(frozen=True)
class SessionLimits:
    """What one session may send and hold.

    - ``max_chunk_bytes``: bytes of one chunk's payload (checked before decoding; 413);
    - ``max_chunks_per_s`` / ``burst``: a token bucket on chunks (over it: the chunk is refused, 429);
    - ``idle_timeout_s``: a session with no chunk for this long is flushed and closed;
    - ``max_pending_chunks``: chunks accepted and not run yet (over it: refused, 429 — the models
      or the reader are behind);
    - ``max_pending_events``: events produced and not read yet; when full, the session stops
      running chunks (so its pending chunks fill, and new ones are refused) — a slow reader is
      bounded here, never buffered without bound;
    - ``slow_reader_s``: a session whose reader leaves the event queue full this long is closed;
    - ``max_sessions``: sessions open at once on one server (over it: refused, 429);
    - ``coalesce_chunks``: at most this many waiting audio chunks of a session run as one (1: never).
    """

    max_chunk_bytes: int = 1 << 20
    max_chunks_per_s: float = 100.0
    burst: int = 50
    idle_timeout_s: float = 30.0
    max_pending_chunks: int = 64
    max_pending_events: int = 256
    slow_reader_s: float = 10.0
    max_sessions: int = 4096
    coalesce_chunks: int = 16

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> SessionLimits:
        """``["max_chunk_bytes=65536", ...]`` → limits (unknown keys and bad values: UsageError)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, float | int] = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in fields:
                raise UsageError(
                    f"--stream-limit {pair!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}; "
                    "fix: e.g. --stream-limit max_chunk_bytes=65536"
                )
            kind = int if fields[key].type in ("int", int) else float
            try:
                value = kind(raw)
            except ValueError:
                value = -1
            if not 0 < value < math.inf:  # nan and inf too: float("nan") parses
                raise UsageError(
                    f"--stream-limit {pair!r}: {key} must be a finite, positive {kind.__name__}; "
                    f"fix: e.g. --stream-limit {key}={fields[key].default}"
                )
            values[key] = value
        return cls(**values)  # type: ignore[arg-type]
