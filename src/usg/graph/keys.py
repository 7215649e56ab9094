"""One wording for an unknown key anywhere in a graph file, with the closest known key as a hint."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from usg.errors import GraphProblem

__all__ = ["unknown_key"]


def unknown_key(where: str, key: object, allowed: Iterable[str]) -> GraphProblem:
    """``WHERE.KEY: unknown key 'KEY'`` with ``did you mean 'CLOSE'?`` when a known key is close to it."""
    names = sorted(allowed)
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return GraphProblem(f"{where}.{key}", f"unknown key {key!r}", f"{hint}remove it, or use one of: {', '.join(names)}")
