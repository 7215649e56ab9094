"""The shape of a profile (``usg profile``, ``GET /v1/monitor/window``), checked when one is read.

The drift tests read every section with defaults, so a damaged or hand-edited file either crashed
them (a list where an object belongs, strings in a sample) or, worse, was compared in part and
said "no drift". :func:`check_profile` walks every field the tests read and names the first that
is wrong by its path in the file (``inputs.text.numeric.characters.sample[3]``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from usg.errors import UsageError

__all__ = ["check_profile"]


class _Bad(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} {why}")


def _obj(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _Bad(path, f"is {_kind(v)}, not an object")
    return v


def _count(v: Any, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _Bad(path, f"is {v!r}, not a count (an integer >= 0)")
    return v


def _number(v: Any, path: str, *, optional: bool = False, finite: bool = False) -> None:
    """A number; NaN and inf pass unless ``finite`` (a model's NaN output is data the profile keeps)."""
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (finite and not math.isfinite(v)):
        raise _Bad(path, f"is {_short(v)}, not a {'finite ' if finite else ''}number")


def _numbers(v: Any, path: str, *, finite: bool = False) -> list[Any]:
    """A list of numbers; null passes unless ``finite``: it is how GET /v1/monitor/window writes a NaN
    (``usg.monitor.http.jsonable``), and the drift tests read it as NaN."""
    if not isinstance(v, list):
        raise _Bad(path, f"is {_kind(v)}, not a list of numbers")
    for i, x in enumerate(v):
        _number(x, f"{path}[{i}]", optional=not finite, finite=finite)
    return v


def _summary(v: Any, path: str) -> None:
    """A numeric summary (sketch.numeric_summary): n, a sample, and the moments when n > 0."""
    s = _obj(v, path)
    _count(s.get("n"), f"{path}.n")
    _numbers(s.get("sample"), f"{path}.sample")
    for key in ("mean", "std", "min", "max"):
        if key in s:
            _number(s[key], f"{path}.{key}", optional=True)
    if "quantiles" in s:
        for q, x in _obj(s["quantiles"], f"{path}.quantiles").items():
            _number(x, f"{path}.quantiles.{q}", optional=True)


def _input(v: Any, path: str) -> None:
    s = _obj(v, path)
    if not isinstance(s.get("modality"), str):
        raise _Bad(f"{path}.modality", f"is {_short(s.get('modality'))}, not a modality name")
    _count(s.get("count"), f"{path}.count")
    for feat, summary in _obj(s.get("numeric", {}), f"{path}.numeric").items():
        _summary(summary, f"{path}.numeric.{feat}")
    for feat, counts in _obj(s.get("categorical", {}), f"{path}.categorical").items():
        for cat, n in _obj(counts, f"{path}.categorical.{feat}").items():
            _count(n, f"{path}.categorical.{feat}.{cat}")


def _output(v: Any, path: str) -> None:
    s = _obj(v, path)
    kind = s.get("kind")
    if kind not in ("embedding", "score"):
        raise _Bad(f"{path}.kind", f"is {_short(kind)}, not 'embedding' or 'score'")
    if not _count(s.get("count"), f"{path}.count"):
        return  # nothing was watched: the tests skip it
    if kind == "embedding":
        dim = _count(s.get("dim"), f"{path}.dim")
        if len(_numbers(s.get("centroid"), f"{path}.centroid")) != dim:
            raise _Bad(f"{path}.centroid", f"has {len(s['centroid'])} values, dim says {dim}")
        _summary(s.get("distance"), f"{path}.distance")
        rows = s.get("sample")
        if not isinstance(rows, list):
            raise _Bad(f"{path}.sample", f"is {_kind(rows)}, not a list of vectors")
        for i, row in enumerate(rows):
            if len(_numbers(row, f"{path}.sample[{i}]")) != dim:
                raise _Bad(f"{path}.sample[{i}]", f"has {len(row)} values, dim says {dim}")
    else:
        hist = _obj(s.get("histogram"), f"{path}.histogram")
        edges = _numbers(hist.get("edges"), f"{path}.histogram.edges", finite=True)
        counts = hist.get("counts")
        if not isinstance(counts, list):
            raise _Bad(f"{path}.histogram.counts", f"is {_kind(counts)}, not a list of counts")
        for i, n in enumerate(counts):
            _count(n, f"{path}.histogram.counts[{i}]")
        if len(edges) < 2 or len(counts) != len(edges) - 1 or any(b <= a for a, b in itertools.pairwise(edges)):
            raise _Bad(f"{path}.histogram", f"has {len(edges)} edges (increasing?) for {len(counts)} counts")
        _summary(s.get("values"), f"{path}.values")


def check_profile(doc: Mapping[str, Any], where: str) -> None:
    """Raise :class:`UsageError` naming the first field of ``doc`` (a profile read from ``where``)
    that the drift tests could not read as written by ``usg profile``."""
    try:
        _count(doc.get("count"), "count")
        for name, share in _obj(doc.get("presence", {}), "presence").items():
            _number(share, f"presence.{name}", finite=True)
        for name, section in _obj(doc.get("inputs"), "inputs").items():
            _input(section, f"inputs.{name}")
        for name, section in _obj(doc.get("outputs"), "outputs").items():
            _output(section, f"outputs.{name}")
    except _Bad as bad:
        raise UsageError(
            f"{where}: {bad} — the profile is damaged or was edited; fix: write it again with `usg profile` "
            "(or GET /v1/monitor/window)"
        ) from None


def _kind(v: Any) -> str:
    return "missing" if v is None else f"a {type(v).__name__}"


def _short(v: Any) -> str:
    if v is None:
        return "missing"
    text = repr(v)
    return text if len(text) <= 60 else f"{text[:60]}…"
