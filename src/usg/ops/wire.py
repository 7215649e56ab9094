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
A placeholder's shape, dtype and size may be read; reading its values from Python — arithmetic
and other ufuncs, numpy functions, indexing, iteration, conversions, methods such as ``tobytes``
or ``reshape`` — raises :class:`usg.errors.DeferredValueRead` naming the node and port it came
from (they would be zeros, not the values). Readers that take the memory directly (the buffer
protocol: ``np.asarray`` then indexing, a C extension) get past that; the executor checks the
inputs of every local model call while it defers anything (:mod:`usg.runtime.deferral`).

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

__all__ = [
    "BestPath",
    "best_path",
    "check_not_placeholder",
    "deferring",
    "derived",
    "is_placeholder",
    "materialize",
    "name_placeholders",
    "wire_source",
]

_local = threading.local()  # .defer: derived() returns placeholders in this thread; .where: the node


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


# what may be read of a placeholder: its metadata (the contract checks, payload sizes, pickling)
_METADATA = frozenset({"shape", "dtype", "ndim", "size", "nbytes", "itemsize", "strides", "flags"})
# dunder attributes that hand out its memory
_DATA_DUNDERS = frozenset({"__array__", "__array_interface__", "__array_struct__", "__dlpack__", "__buffer__"})


class _Placeholder(_Derived):
    """A :func:`derived` array that was never computed: every read of its values from Python
    raises :class:`~usg.errors.DeferredValueRead` (see the module docstring). Only placeholders are
    of this class, so a computed array pays for none of these hooks."""

    _usg_where = ""  # "node 'det_pre' port 'x'" (set by the executor), or "node 'det_pre'" while it runs

    def __array_finalize__(self, obj: Any) -> None:
        self._usg_fn = None  # a view of a placeholder is not what fn computes, and still has no values
        self._usg_where = getattr(obj, "_usg_where", "")

    def __getattribute__(self, name: str) -> Any:
        if name in _DATA_DUNDERS or not (name.startswith("_") or name in _METADATA):
            raise _read_error(self, f"attribute .{name}")
        return super().__getattribute__(name)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise _read_error(self, f"numpy.{ufunc.__name__}")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in _SHAPE_FUNCTIONS:
            return func(*(np.ndarray.view(a, np.ndarray) if type(a) is _Placeholder else a for a in args), **kwargs)
        raise _read_error(self, f"numpy.{func.__name__}")

    def __getitem__(self, key: Any) -> Any:
        raise _read_error(self, "indexing")

    def __iter__(self) -> Any:
        raise _read_error(self, "iteration")

    def __bool__(self) -> bool:
        raise _read_error(self, "bool()")

    def __float__(self) -> float:
        raise _read_error(self, "float()")

    def __int__(self) -> int:
        raise _read_error(self, "int()")

    def __index__(self) -> int:
        raise _read_error(self, "an index")

    def __complex__(self) -> complex:
        raise _read_error(self, "complex()")

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._usg_fn is None:  # a view or copy made of it: it would travel as zeros
            raise _read_error(self, "pickling a view or copy of it (it would travel as zeros)")
        return (_rebuild, (self._usg_fn, self._usg_args))

    def __repr__(self) -> str:
        where = f" from {self._usg_where}" if self._usg_where else ""
        return f"<deferred placeholder{where}: shape {self.shape}, dtype {self.dtype}, values not computed>"

    __str__ = __repr__


_SHAPE_FUNCTIONS = frozenset({np.shape, np.ndim, np.size})


def _read_error(value: _Placeholder, how: str) -> Exception:
    from usg.errors import DeferredValueRead

    where = value._usg_where or "a usg.ops.wire.deferring block"
    fn = getattr(value._usg_fn, "__qualname__", None)
    made = f" (derived from {fn})" if fn else ""
    return DeferredValueRead(
        f"the values of a deferred placeholder from {where}{made} were read ({how}): shape "
        f"{tuple(value.shape)}, dtype {value.dtype}; the executor did not compute them because only "
        "remote models (--engine ray) read that port, and here they would read as zeros; fix: read "
        "the port only from remote models, make it a graph output or read it from a local node "
        "(then it is computed), or call usg.ops.wire.materialize(value) before reading it"
    )


def check_not_placeholder(value: Any, where: str) -> None:
    """Raise :class:`~usg.errors.DeferredValueRead` if ``value`` is a placeholder (``where``: who
    reads it; for readers that take the memory directly, past the Python hooks)."""
    if type(value) is _Placeholder:
        raise _read_error(value, where)


def _rebuild(fn: Callable[..., np.ndarray], args: tuple[Any, ...]) -> np.ndarray:
    return fn(*args)


def derived(
    fn: Callable[..., np.ndarray], *args: Any, shape: tuple[int, ...] | None = None, dtype: str | None = None
) -> np.ndarray:
    """``fn(*args)``, marked to travel as ``fn`` (a module-level function) and ``args``.

    ``shape`` and ``dtype``: what ``fn(*args)`` returns, known without computing it; inside
    :func:`deferring` the result is then a placeholder (see the module docstring)."""
    out: _Derived
    if shape is not None and dtype is not None and getattr(_local, "defer", False):
        out = np.broadcast_to(np.zeros((), dtype=dtype), shape).view(_Placeholder)  # read-only, no memory
        out._usg_where = getattr(_local, "where", "")
    else:
        out = fn(*args).view(_Derived)
    out._usg_fn = fn
    out._usg_args = args
    return out


@contextlib.contextmanager
def deferring(where: str = "") -> Iterator[None]:
    """In this thread, :func:`derived` calls that declare shape and dtype return placeholders
    (``where``: who makes them, e.g. ``"node 'det_pre'"``, named when one is read)."""
    before = getattr(_local, "defer", False), getattr(_local, "where", "")
    _local.defer, _local.where = True, where
    try:
        yield
    finally:
        _local.defer, _local.where = before


def is_placeholder(value: Any) -> bool:
    """Whether ``value`` is a placeholder :func:`derived` returned inside :func:`deferring`."""
    return type(value) is _Placeholder


def name_placeholders(value: Any, where: str) -> None:
    """Record ``where`` (``"node 'det_pre' port 'x'"``) in every placeholder in ``value`` (in dicts,
    lists, tuples), for the message of a read."""
    if type(value) is _Placeholder:
        value._usg_where = where
    elif isinstance(value, dict):
        for v in value.values():
            name_placeholders(v, where)
    elif isinstance(value, (list, tuple)):
        for v in value:
            name_placeholders(v, where)


def materialize(value: Any) -> Any:
    """``value`` with every placeholder in it (in dicts, lists, tuples) computed; the same
    object when it holds none."""
    if isinstance(value, _Derived):
        if type(value) is _Placeholder:
            if value._usg_fn is None:  # a view of one: no source to compute it from
                raise _read_error(value, "materialize() of a view or copy of it")
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
