"""The ``align:`` node kind: a timestamp-aligned join of several streams (:mod:`usg.runtime.align`).

.. code-block:: yaml

    pair:
      align:
        streams: {audio: vad.segments, frame: inputs.frames}
        tolerance_ms: 300
        max_wait_ms: 500
        on_missing: partial        # or drop
        time_keys: {audio: start_ms}   # optional; default: ts_ms, else start_ms

An align node is a Python node of :func:`usg.runtime.align_node:align_streams` whose input ports are the
streams; every stream is required, so a request without one of them prunes the node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from usg.errors import GraphProblem
from usg.graph.keys import unknown_key

__all__ = ["ALIGN_FN", "ALIGN_KEYS", "RESERVED_STREAMS", "AlignSpec", "parse_align"]

ALIGN_FN = "usg.runtime.align_node:align_streams"
ALIGN_KEYS = {"streams", "tolerance_ms", "max_wait_ms", "on_missing", "time_keys"}
#: keys of an output tuple besides the streams: a stream may not be named after them
RESERVED_STREAMS = {"ts_ms", "skew_ms", "missing", *ALIGN_KEYS}


@dataclass(frozen=True)
class AlignSpec:
    """How an align node pairs its streams (the ``align:`` mapping of a node)."""

    streams: tuple[str, ...]
    tolerance_ms: float = 300.0
    max_wait_ms: float = 500.0
    on_missing: str = "partial"
    time_keys: dict[str, str] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """The options the node function gets."""
        return {
            "streams": list(self.streams),
            "tolerance_ms": self.tolerance_ms,
            "max_wait_ms": self.max_wait_ms,
            "on_missing": self.on_missing,
            "time_keys": dict(self.time_keys),
        }

    def describe(self) -> str:
        """``align audio, frame ±300 ms (wait 500 ms, partial)``: a one-line label for pictures and trees."""
        streams = ", ".join(self.streams)
        return f"align {streams} ±{self.tolerance_ms:g} ms (wait {self.max_wait_ms:g} ms, {self.on_missing})"

    def to_mapping(self, refs: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"streams": {s: str(refs[s]) for s in self.streams}}
        out.update(tolerance_ms=self.tolerance_ms, max_wait_ms=self.max_wait_ms, on_missing=self.on_missing)
        if self.time_keys:
            out["time_keys"] = dict(self.time_keys)
        return out


def _number(problems: list[GraphProblem], where: str, data: Mapping[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        problems.append(
            GraphProblem(f"{where}.{key}", f"{key} is {value!r}", "use a finite, non-negative number of ms")
        )
        return default
    return float(value)


def parse_align(where: str, data: Any) -> tuple[AlignSpec | None, dict[str, str], list[GraphProblem]]:
    """``align:`` mapping → (spec, stream → reference text, problems)."""
    problems: list[GraphProblem] = []
    fix = "write align: {streams: {NAME: NODE.PORT | inputs.NAME, ...}, tolerance_ms: 300, max_wait_ms: 500}"
    if not isinstance(data, dict):
        return None, {}, [GraphProblem(where, f"align is {data!r}, not a mapping", fix)]
    for key in data:
        if key not in ALIGN_KEYS:
            problems.append(unknown_key(where, key, ALIGN_KEYS))
    streams = data.get("streams")
    if not isinstance(streams, dict) or len(streams) < 2:
        problems.append(GraphProblem(f"{where}.streams", f"streams is {streams!r}: two or more are needed", fix))
        streams = {}
    refs = {str(k): str(v) for k, v in streams.items()}
    for name in refs:
        if name in RESERVED_STREAMS:
            problems.append(
                GraphProblem(f"{where}.streams.{name}", f"stream name {name!r} is reserved", "rename the stream")
            )
    on_missing = data.get("on_missing", "partial")
    if on_missing not in ("partial", "drop"):
        problems.append(GraphProblem(f"{where}.on_missing", f"on_missing is {on_missing!r}", "use partial or drop"))
        on_missing = "partial"
    time_keys = data.get("time_keys") or {}
    if not isinstance(time_keys, dict) or any(k not in refs or not isinstance(v, str) for k, v in time_keys.items()):
        problems.append(
            GraphProblem(f"{where}.time_keys", f"time_keys is {time_keys!r}", "write time_keys: {STREAM: KEY}")
        )
        time_keys = {}
    spec = AlignSpec(
        streams=tuple(refs),
        tolerance_ms=_number(problems, where, data, "tolerance_ms", 300.0),
        max_wait_ms=_number(problems, where, data, "max_wait_ms", 500.0),
        on_missing=str(on_missing),
        time_keys={str(k): str(v) for k, v in time_keys.items()},
    )
    return spec, refs, problems
