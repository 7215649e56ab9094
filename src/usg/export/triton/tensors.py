"""Tensor declarations of exported Triton models: dtypes and full shapes, from ONNX files and USG specs.

A :class:`Wire` is what one tensor looks like end to end (Triton dtype, full shape with -1 for
any dynamic dim). :func:`declare` turns it into the ``dims`` Triton wants: the batch dim dropped
when the model batches, and the ``dims: [1]`` + ``reshape: []`` item axis where nothing is left
(see :mod:`usg.export.triton.wire`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from usg.doctor.triton.config import DTYPE_TO_ONNX
from usg.doctor.triton.crosscheck import OnnxTensor
from usg.export.triton.wire import triton_dtype
from usg.specs import TensorSpec

__all__ = ["ModelWires", "TritonTensor", "Wire", "batchable", "declare", "onnx_wires", "spec_wire", "spec_wires"]


@dataclass(frozen=True)
class Wire:
    """A tensor's Triton dtype (``TYPE_FP32`` ...) and full shape (batch dim included, -1 = dynamic)."""

    data_type: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TritonTensor:
    """One ``input`` / ``output`` entry of a config.pbtxt."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False

    @property
    def item_axis(self) -> bool:
        """Declared ``dims: [1]`` over a model-side scalar per item (``reshape: []``)."""
        return self.reshape == ()


ModelWires = tuple[dict[str, Wire], dict[str, Wire]]

_ONNX_TO_TRITON = {v: k for k, v in DTYPE_TO_ONNX.items()}


def declare(name: str, wire: Wire, *, batched: bool, optional: bool = False) -> TritonTensor:
    """The config entry for ``wire``: per-item dims when ``batched``, the full shape otherwise."""
    dims = wire.shape[1:] if batched else wire.shape
    if not dims:
        return TritonTensor(name, wire.data_type, (1,), (), optional)
    return TritonTensor(name, wire.data_type, tuple(dims), None, optional)


def batchable(wires: ModelWires) -> bool:
    """True when every input and output has a dynamic first dim Triton can use as the batch dim."""
    tensors = [*wires[0].values(), *wires[1].values()]
    return bool(tensors) and all(w.shape and w.shape[0] == -1 for w in tensors)


def spec_wire(spec: TensorSpec | None) -> Wire | None:
    """A USG spec → its Wire; None when the spec gives no dtype Triton knows or no shape."""
    if spec is None or spec.shape is None:
        return None
    data_type = triton_dtype(spec.dtype)
    if data_type is None:
        return None
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in spec.shape)
    return Wire(data_type, dims)


def spec_wires(specs: Mapping[str, TensorSpec]) -> dict[str, Wire] | None:
    out: dict[str, Wire] = {}
    for name, spec in specs.items():
        wire = spec_wire(spec)
        if wire is None:
            return None
        out[name] = wire
    return out


def onnx_wires(path: Path) -> ModelWires:
    """Inputs and outputs of an ONNX file as Triton sees them (the doctor's reading of the file)."""
    import onnx

    from usg.doctor.triton.crosscheck import onnx_io

    ins, outs = onnx_io(onnx.load(str(path), load_external_data=False))

    def conv(table: Mapping[str, OnnxTensor]) -> dict[str, Wire]:
        out: dict[str, Wire] = {}
        for name, t in table.items():
            dtype = _ONNX_TO_TRITON.get(t.dtype)
            if dtype is None:
                raise ValueError(f"{path}: tensor {name!r} is ONNX {t.dtype}, which no Triton TYPE_ carries")
            out[name] = Wire(dtype, tuple(t.dims))
        return out

    return conv(ins), conv(outs)
