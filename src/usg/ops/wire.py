"""Compact wire forms of node values, for engines that send them between processes (Ray).

:func:`derived` marks an array that a pure function computed from a smaller source (a
float32 model input normalised from a uint8 image): in this process it is the array itself,
but it pickles as the function and its source, so the receiving process (the model's
replica) recomputes it there — the same code on the same bytes, so the same values. A
1×3×736×1440 det input crosses as its 1.1–3.2 MB uint8 image instead of 12.7 MB of float32.
Where the array is only sent (an executor whose consumers of the value are all remote, inside
:func:`deferring`), a ``derived`` call that declares the result's shape and dtype does not
compute it at all: it returns a placeholder of that shape and dtype (no memory behind it) that
still travels as ``(fn, source)``; :func:`materialize` computes any placeholder left in a value.

:class:`BestPath` is what greedy CTC decoding reads of a recogniser's per-step
probabilities (the best class and its probability at each step): an op that only needs that
declares a *reducer* for the input (``@op(reducers={"probs": "usg.ops.wire:best_path"})``),
and an engine may apply it on the model's replica, sending T pairs instead of T × 6625 floats.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BestPath", "best_path", "deferring", "derived", "is_placeholder", "materialize", "wire_source"]

_local = threading.local()  # .defer: derived() returns placeholders in this thread


class _Derived(np.ndarray):
    """An ndarray that pickles as ``(fn, source)``; slices and results of arithmetic are plain arrays."""

    _usg_fn: Callable[..., np.ndarray] | None = None
    _usg_args: tuple[Any, ...] = ()
    _usg_placeholder = False  # the values were never computed: only shape and dtype are real

    def __array_finalize__(self, obj: Any) -> None:
        self._usg_fn = None  # a view or result of this array is not what fn computes
        self._usg_placeholder = False

    def __array_wrap__(self, out: Any, context: Any = None, return_scalar: bool = False) -> Any:
        return np.asarray(out) if isinstance(out, np.ndarray) else out

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._usg_fn is None:
            return self.view(np.ndarray).__reduce_ex__(protocol)
        return (_rebuild, (self._usg_fn, self._usg_args))


def _rebuild(fn: Callable[..., np.ndarray], args: tuple[Any, ...]) -> np.ndarray:
    return fn(*args)


def derived(
    fn: Callable[..., np.ndarray], *args: Any, shape: tuple[int, ...] | None = None, dtype: str | None = None
) -> np.ndarray:
    """``fn(*args)``, marked to travel as ``fn`` (a module-level function) and ``args``.

    ``shape`` and ``dtype``: what ``fn(*args)`` returns, known without computing it; inside
    :func:`deferring` the result is then a placeholder (see the module docstring)."""
    if shape is not None and dtype is not None and getattr(_local, "defer", False):
        out = np.broadcast_to(np.zeros((), dtype=dtype), shape).view(_Derived)  # read-only, no memory
        out._usg_placeholder = True
    else:
        out = fn(*args).view(_Derived)
    out._usg_fn = fn
    out._usg_args = args
    return out


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """In this thread, :func:`derived` calls that declare shape and dtype return placeholders."""
    before = getattr(_local, "defer", False)
    _local.defer = True
    try:
        yield
    finally:
        _local.defer = before


def is_placeholder(value: Any) -> bool:
    """Whether ``value`` is a placeholder :func:`derived` returned inside :func:`deferring`."""
    return isinstance(value, _Derived) and value._usg_placeholder


def materialize(value: Any) -> Any:
    """``value`` with every placeholder in it (in dicts, lists, tuples) computed; the same
    object when it holds none."""
    if isinstance(value, _Derived):
        if value._usg_placeholder and value._usg_fn is not None:
            return derived(value._usg_fn, *value._usg_args)  # no shape given: computed
        return value
    if isinstance(value, dict):
        done = {k: materialize(v) for k, v in value.items()}
        return done if any(done[k] is not v for k, v in value.items()) else value
    if isinstance(value, (list, tuple)):
        items = [materialize(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


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
