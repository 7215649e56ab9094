"""Tensor contracts: :class:`TensorSpec`, :class:`Modality` and dtype helpers.

A spec is checked at build time (is an edge producer → consumer compatible?)
and at run time (does this array satisfy the model input it is about to enter?).
Run-time checks are cheap: dtype, rank and fixed dims always; the value range
only where one is declared (it costs a min/max pass over the data).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["AudioSpec", "Dim", "Modality", "TensorSpec", "dtype_name", "merge_declared", "onnx_type_to_dtype"]

Dim = int | str | None
"""One axis: a fixed size, a symbolic name shared across axes (``"batch"``), or ``None`` (any)."""


class Modality(enum.StrEnum):
    """What kind of thing a graph input carries."""

    IMAGE = "image"
    TEXT = "text"
    AUDIO = "audio"
    TENSOR = "tensor"


_DTYPE_NAMES: dict[np.dtype[Any], str] = {}


def _dtype_name(dtype: np.dtype[Any]) -> str:
    """``float32``, ``int64``..., ``str`` for strings and objects (numpy's ``dtype.name`` is slow:
    it runs Python code on each access, and contracts are checked per item)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        if dtype.kind in ("U", "S", "O"):
            return "str"  # not cached: one dtype per string length
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


@dataclass(frozen=True)
class AudioSpec:
    """What an audio input is turned into: ``sample_rate`` Hz, ``channels`` (1 = mono mix), at most ``max_seconds``."""

    sample_rate: int = 16_000
    channels: int = 1
    max_seconds: float = 600.0


_ONNX_TO_NUMPY = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "str",
}


def onnx_type_to_dtype(onnx_type: str) -> str | None:
    """Map ONNX Runtime's ``tensor(float)`` spelling to a numpy dtype name (``float32``)."""
    return _ONNX_TO_NUMPY.get(onnx_type)


def dtype_name(value: Any) -> str:
    """Canonical dtype name of a numpy dtype, array, or dtype-like string."""
    if isinstance(value, np.ndarray):
        return value.dtype.name
    if isinstance(value, str) and value in ("str", "string"):
        return "str"
    return np.dtype(value).name


def _fmt_shape(shape: Sequence[Dim] | None) -> str:
    if shape is None:
        return "any shape"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorSpec:
    """The contract of one tensor.

    ``dtype``: numpy dtype name, or ``None`` for any.
    ``shape``: a tuple of dims, or ``None`` for any rank. Dims are ints (fixed),
    strings (symbolic; equal names must be equal sizes within one tensor), or ``None``.
    ``range``: inclusive ``(low, high)`` the values must lie in, if declared.
    ``layout``: a free tag such as ``"NCHW"`` or ``"HWC"``, used in messages and edge checks.
    """

    dtype: str | None = None
    shape: tuple[Dim, ...] | None = None
    range: tuple[float, float] | None = None
    layout: str | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None:
            object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))
        if self.range is not None:
            lo, hi = self.range
            object.__setattr__(self, "range", (float(lo), float(hi)))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        shape = data.get("shape")
        rng = data.get("range")
        return cls(
            dtype=data.get("dtype"),
            shape=None if shape is None else tuple(shape),
            range=None if rng is None else (rng[0], rng[1]),
            layout=data.get("layout"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.range is not None:
            out["range"] = list(self.range)
        if self.layout is not None:
            out["layout"] = self.layout
        return out

    def describe(self) -> str:
        parts = [self.dtype or "any dtype", _fmt_shape(self.shape)]
        if self.layout:
            parts.append(self.layout)
        if self.range is not None:
            parts.append(f"range [{self.range[0]:g},{self.range[1]:g}]")
        return " ".join(parts)

    # -- run time -------------------------------------------------------------------------
    def check(self, value: Any, *, check_range: bool = True) -> list[str]:
        """Return the violations of ``value`` against this spec (empty list: it conforms)."""
        arr = value if isinstance(value, np.ndarray) else None
        if arr is None:
            if isinstance(value, (list, tuple)) and self.dtype == "str":
                return []
            if np.isscalar(value) and self.shape in (None, ()):
                arr = np.asarray(value)
            else:
                return [f"expected an array ({self.describe()}), got {type(value).__name__}"]
        out: list[str] = []
        got_dtype = _dtype_name(arr.dtype)
        if self.dtype is not None and got_dtype != self.dtype:
            out.append(f"dtype {got_dtype}, expected {self.dtype}")
        if self.shape is not None:
            if arr.ndim != len(self.shape):
                out.append(
                    f"rank {arr.ndim} (shape {list(arr.shape)}), expected rank {len(self.shape)} "
                    f"{_fmt_shape(self.shape)}"
                )
            else:
                bound: dict[str, int] = {}
                for axis, (want, got) in enumerate(zip(self.shape, arr.shape, strict=True)):
                    if isinstance(want, int) and want >= 0 and want != got:
                        out.append(
                            f"dim {axis} is {got}, expected {want} "
                            f"(shape {list(arr.shape)} vs {_fmt_shape(self.shape)})"
                        )
                    elif isinstance(want, str):
                        if want in bound and bound[want] != got:
                            out.append(f"dim {axis} ({want}) is {got} but {want}={bound[want]} elsewhere")
                        bound.setdefault(want, got)
        if check_range and self.range is not None and arr.size and arr.dtype.kind in "biuf":
            lo, hi = float(arr.min()), float(arr.max())
            if lo < self.range[0] or hi > self.range[1]:
                out.append(f"values in [{lo:g},{hi:g}], expected within [{self.range[0]:g},{self.range[1]:g}]")
        return out

    # -- build time -----------------------------------------------------------------------
    def compatible_with(self, consumer: TensorSpec) -> list[str]:
        """Problems if a tensor meeting ``self`` flows into an input declared as ``consumer``."""
        out: list[str] = []
        if self.dtype and consumer.dtype and self.dtype != consumer.dtype:
            out.append(f"dtype {self.dtype} flows into {consumer.dtype}")
        if self.shape is not None and consumer.shape is not None:
            if len(self.shape) != len(consumer.shape):
                out.append(
                    f"rank {len(self.shape)} {_fmt_shape(self.shape)} flows into rank "
                    f"{len(consumer.shape)} {_fmt_shape(consumer.shape)}"
                )
            else:
                for axis, (a, b) in enumerate(zip(self.shape, consumer.shape, strict=True)):
                    if isinstance(a, int) and isinstance(b, int) and a >= 0 and b >= 0 and a != b:
                        out.append(f"dim {axis}: {a} flows into fixed {b}")
        if self.layout and consumer.layout and self.layout != consumer.layout:
            out.append(f"layout {self.layout} flows into {consumer.layout}")
        if self.range is not None and consumer.range is not None:
            lo, hi = self.range
            clo, chi = consumer.range
            if lo < clo or hi > chi:
                out.append(f"range [{lo:g},{hi:g}] flows into [{clo:g},{chi:g}]")
        return out


def merge_declared(base: Mapping[str, TensorSpec], declared: Mapping[str, TensorSpec]) -> dict[str, TensorSpec]:
    """``base`` specs (from a model file) tightened by the graph's declared ones, port by port:
    a declared dtype, shape or layout replaces the file's; the declared range is the range."""
    merged = dict(base)
    for port, spec in declared.items():
        was = merged.get(port, TensorSpec())
        merged[port] = TensorSpec(
            spec.dtype or was.dtype,
            spec.shape if spec.shape is not None else was.shape,
            spec.range,
            spec.layout or was.layout,
        )
    return merged
