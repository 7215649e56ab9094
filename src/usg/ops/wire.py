"""Compact wire forms of node values, for engines that send them between processes (Ray).

:func:`derived` marks an array that a pure function computed from a smaller source (a
float32 model input normalised from a uint8 image): in this process it is the array itself,
but it pickles as the function and its source, so the receiving process (the model's
replica) recomputes it there — the same code on the same bytes, so the same values. A
1×3×736×1440 det input crosses as its 1.1–3.2 MB uint8 image instead of 12.7 MB of float32.

:class:`BestPath` is what greedy CTC decoding reads of a recogniser's per-step
probabilities (the best class and its probability at each step): an op that only needs that
declares a *reducer* for the input (``@op(reducers={"probs": "usg.ops.wire:best_path"})``),
and an engine may apply it on the model's replica, sending T pairs instead of T × 6625 floats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BestPath", "best_path", "derived", "wire_source"]


class _Derived(np.ndarray):
    """An ndarray that pickles as ``(fn, source)``; slices and results of arithmetic are plain arrays."""

    _usg_fn: Callable[..., np.ndarray] | None = None
    _usg_args: tuple[Any, ...] = ()

    def __array_finalize__(self, obj: Any) -> None:
        self._usg_fn = None  # a view or result of this array is not what fn computes

    def __array_wrap__(self, out: Any, context: Any = None, return_scalar: bool = False) -> Any:
        return np.asarray(out) if isinstance(out, np.ndarray) else out

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._usg_fn is None:
            return self.view(np.ndarray).__reduce_ex__(protocol)
        return (_rebuild, (self._usg_fn, self._usg_args))


def _rebuild(fn: Callable[..., np.ndarray], args: tuple[Any, ...]) -> np.ndarray:
    return fn(*args)


def derived(fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    """``fn(*args)``, marked to travel as ``fn`` (a module-level function) and ``args``."""
    out = fn(*args).view(_Derived)
    out._usg_fn = fn
    out._usg_args = args
    return out


def wire_source(value: Any) -> tuple[Any, ...] | None:
    """The arguments a :func:`derived` array travels as, or None for any other value."""
    if isinstance(value, _Derived) and value._usg_fn is not None:
        return value._usg_args
    return None


@dataclass(frozen=True)
class BestPath:
    """The most likely class and its probability at each step of one item's ``[1, T, C]`` output."""

    indices: np.ndarray  # int64 [T]
    scores: np.ndarray  # float32 [T]


def best_path(probs: np.ndarray) -> BestPath:
    """:class:`BestPath` of a ``[1, T, C]`` probability array (argmax and max over C)."""
    p = np.asarray(probs)[0]
    return BestPath(p.argmax(axis=1), p.max(axis=1))
