"""The graph's ``limits:`` section: resource limits a request may not exceed.

Each limit has a default and is raised or lowered in the graph YAML::

    limits:
      max_image_pixels: 40000000   # pixels of one decoded image
      max_fanout_items: 1024       # items one request's map node may fan out to
      max_text_chars: 100000       # characters of one text given to a tokenizer

An exceeded limit is a 413 (:class:`usg.errors.PayloadTooLarge`) naming the limit and the
graph key ``limits.NAME`` that raises it. New limits are added as fields here.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from usg.errors import GraphProblem

__all__ = ["GraphLimits", "parse_limits"]


@dataclass(frozen=True)
class GraphLimits:
    """Per-request resource limits (see the module docstring); every field is a positive int."""

    max_image_pixels: int = 40_000_000
    max_fanout_items: int = 1024
    max_text_chars: int = 100_000

    def declared(self) -> dict[str, int]:
        """The limits that differ from their defaults (what a graph file needs to say)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}


def _names() -> list[str]:
    return [f.name for f in dataclasses.fields(GraphLimits)]


def parse_limits(value: Any, where: str = "limits") -> tuple[GraphLimits, list[GraphProblem]]:
    """The limits of a ``limits:`` mapping (None: all defaults) and the problems found in it."""
    if value is None:
        return GraphLimits(), []
    if not isinstance(value, Mapping):
        fix = "write limits: {max_image_pixels: N, max_fanout_items: N, max_text_chars: N}"
        return GraphLimits(), [GraphProblem(where, f"expected a mapping, got {type(value).__name__} {value!r}", fix)]
    names = _names()
    problems: list[GraphProblem] = []
    given: dict[str, int] = {}
    for key, raw in value.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                GraphProblem(f"{where}.{key}", f"unknown limit {key!r}", f"{hint}use one of: {', '.join(names)}")
            )
        elif isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            problems.append(
                GraphProblem(f"{where}.{key}", f"{key} is {raw!r}", "use a positive integer (no quotes, no units)")
            )
        else:
            given[str(key)] = raw
    return GraphLimits(**given), problems
