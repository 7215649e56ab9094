"""The graph's ``limits:`` section: resource limits a request may not exceed.

Each limit has a default and is raised or lowered in the graph YAML::

    limits:
      max_body_bytes: 33554432     # bytes of one HTTP request body (default: usg serve --max-body-mb, 32 MiB)
      max_nesting_depth: 32        # nesting of JSON arrays/objects in a request body
      max_image_pixels: 40000000   # pixels of one decoded image (checked from the header, before decoding)
      max_aspect_ratio: 50         # longer side / shorter side of one image
      image_formats: [PNG, JPEG]   # formats an image input may arrive in (or one list per input name)
      max_fanout_items: 1024       # items one request's map node may fan out to
      max_text_chars: 20000        # characters of one text input (checked before tokenizing)

An exceeded limit is a 413 (:class:`usg.errors.PayloadTooLarge`) naming the limit and the
graph key ``limits.NAME`` that raises it. New limits are added as fields here, with their
check in :func:`_check_value`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from usg.errors import GraphProblem

__all__ = ["IMAGE_FORMATS", "GraphLimits", "parse_limits"]

#: formats an image input may be decoded from (Pillow format names); never EPS/PS (Ghostscript)
IMAGE_FORMATS = ("BMP", "GIF", "ICO", "JPEG", "PNG", "PPM", "TIFF", "WEBP")


@dataclass(frozen=True)
class GraphLimits:
    """Per-request resource limits (see the module docstring); ``None`` means the serving default."""

    max_body_bytes: int | None = None
    max_nesting_depth: int = 32
    max_image_pixels: int = 40_000_000
    max_aspect_ratio: float = 50.0
    image_formats: tuple[str, ...] | Mapping[str, tuple[str, ...]] | None = None
    max_fanout_items: int = 1024
    max_text_chars: int = 20_000  # tokenizing 20k CJK characters takes ~0.1-0.4 s on one core

    def declared(self) -> dict[str, Any]:
        """The limits that differ from their defaults (what a graph file needs to say), YAML-ready."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if isinstance(value, Mapping):
                value = {k: list(v) for k, v in value.items()}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


def _names() -> list[str]:
    return [f.name for f in dataclasses.fields(GraphLimits)]


def _formats(raw: Any) -> tuple[str, ...] | str:
    """A list of image formats, or the problem with it."""
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)) or not raw:
        return f"expected a non-empty list of formats, got {raw!r}"
    names = tuple(str(f).upper() for f in raw)
    bad = [f for f in names if f not in IMAGE_FORMATS]
    if bad:
        return f"unsupported image format(s) {', '.join(bad)}"
    return names


def _check_value(key: str, raw: Any) -> tuple[Any, str | None]:
    """The parsed value of limit ``key`` and, when it is invalid, the problem with it."""
    if key == "image_formats":
        if isinstance(raw, Mapping):
            per_input: dict[str, tuple[str, ...]] = {}
            for name, formats in raw.items():
                parsed = _formats(formats)
                if isinstance(parsed, str):
                    return None, f"image_formats.{name}: {parsed}"
                per_input[str(name)] = parsed
            return per_input, None
        parsed = _formats(raw)
        return (None, parsed) if isinstance(parsed, str) else (parsed, None)
    if key == "max_aspect_ratio":
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw >= 1:  # nan too
            return None, f"{key} is {raw!r}"
        return float(raw), None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        return None, f"{key} is {raw!r}"
    return raw, None


_FIXES = {
    "image_formats": f"use a list of formats from {', '.join(IMAGE_FORMATS)} (or a mapping input name -> list)",
    "max_aspect_ratio": "use a number >= 1 (longer side / shorter side)",
}


def parse_limits(value: Any, where: str = "limits") -> tuple[GraphLimits, list[GraphProblem]]:
    """The limits of a ``limits:`` mapping (None: all defaults) and the problems found in it."""
    if value is None:
        return GraphLimits(), []
    if not isinstance(value, Mapping):
        fix = "write limits: {max_image_pixels: N, max_fanout_items: N, max_text_chars: N}"
        return GraphLimits(), [GraphProblem(where, f"expected a mapping, got {type(value).__name__} {value!r}", fix)]
    names = _names()
    problems: list[GraphProblem] = []
    given: dict[str, Any] = {}
    for key, raw in value.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                GraphProblem(f"{where}.{key}", f"unknown limit {key!r}", f"{hint}use one of: {', '.join(names)}")
            )
            continue
        parsed, problem = _check_value(str(key), raw)
        if problem is not None:
            fix = _FIXES.get(str(key), "use a positive integer (no quotes, no units)")
            problems.append(GraphProblem(f"{where}.{key}", problem, fix))
        else:
            given[str(key)] = parsed
    return GraphLimits(**given), problems
