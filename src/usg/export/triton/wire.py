"""How USG values cross a Triton tensor boundary, at export time and inside the Triton server.

Shared by the config writer (which declares the tensors) and the Python-backend models (which
fill them), so the two cannot disagree:

- dtypes: numpy name ↔ Triton ``TYPE_*`` (``str`` is ``TYPE_STRING``: UTF-8 bytes per element);
- the *item axis*: Triton refuses empty ``dims``, so a tensor whose per-item shape is a scalar
  (a tokenizer's ``text`` ``[batch]``, or a rank-0 tensor of a non-batching model) is declared
  ``dims: [1]`` with ``reshape: {shape: []}``; the model sees the reshaped tensor, a BLS caller
  sends and receives the declared one, so :func:`add_item_axis` / :func:`drop_item_axis` convert;
- outputs with no tensor contract (a list of records such as OCR ``lines``, a dict) travel as
  ``TYPE_STRING`` with one JSON document per list element (one in all for any other value), the
  same wire form as ``usg serve``'s Open Inference Protocol endpoint.

Only numpy is imported here: this module runs inside Triton's Python backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "NUMPY_TO_TRITON",
    "TRITON_TO_NUMPY",
    "add_item_axis",
    "drop_item_axis",
    "from_wire",
    "text_value",
    "to_wire",
    "triton_dtype",
]

NUMPY_TO_TRITON: dict[str, str] = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
    "str": "TYPE_STRING",
}
TRITON_TO_NUMPY: dict[str, str] = {v: k for k, v in NUMPY_TO_TRITON.items()}


def triton_dtype(numpy_dtype: str | None) -> str | None:
    """``float32`` → ``TYPE_FP32``; ``str`` / ``object`` / ``bytes`` → ``TYPE_STRING``; None when unknown."""
    if numpy_dtype in ("object", "bytes", "bytes_", "str_"):
        return "TYPE_STRING"
    return NUMPY_TO_TRITON.get(numpy_dtype or "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _element(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(_jsonable(value), ensure_ascii=False).encode("utf-8")


def to_wire(value: Any, data_type: str) -> np.ndarray:
    """A USG value → the array a Triton tensor of ``data_type`` carries.

    Numeric types: ``np.asarray(value, dtype)``. ``TYPE_STRING``: a string array stays one
    element per string; a list is one element per item (strings as UTF-8, other items as JSON);
    any other value is one element (a string as UTF-8, anything else as JSON).
    """
    if data_type != "TYPE_STRING":
        return np.ascontiguousarray(np.asarray(value, dtype=TRITON_TO_NUMPY[data_type]))
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return np.array([_element(v) for v in value.reshape(-1)], dtype=np.object_).reshape(value.shape)
    if isinstance(value, (list, tuple)):
        return np.array([_element(v) for v in value], dtype=np.object_).reshape(len(value))
    return np.array([_element(value)], dtype=np.object_)


def from_wire(array: np.ndarray) -> Any:
    """A Triton tensor's array → a USG model input: string tensors become lists of ``str``."""
    if array.dtype.kind in "OSU":
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    return array


def text_value(array: np.ndarray, name: str) -> str:
    """The one UTF-8 string a ``TYPE_STRING [1]`` text input carries."""
    flat = array.reshape(-1)
    if flat.size != 1:
        raise ValueError(f"input {name!r}: expected one string (shape [1]), got shape {list(array.shape)}")
    v = flat[0]
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def add_item_axis(value: Any, ports: Sequence[str], port: str) -> Any:
    """Append the declared ``[1]`` axis to ``port`` if it is one of the item-axis ``ports``."""
    if port not in ports:
        return value
    return np.asarray(value)[..., None]


def drop_item_axis(array: np.ndarray, ports: Sequence[str], port: str) -> np.ndarray:
    """Remove the declared ``[1]`` axis from ``port`` if it is one of the item-axis ``ports``."""
    if port not in ports or array.ndim == 0 or array.shape[-1] != 1:
        return array
    return array.reshape(array.shape[:-1])
