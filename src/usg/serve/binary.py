"""The Open Inference Protocol (KServe v2 / Triton) tensor codec, JSON and binary.

Binary tensor data extension: a request or response body is a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw data of every
tensor whose ``parameters.binary_data_size`` is set, in the order the tensors
appear in the header. Numeric tensors are raw little-endian row-major bytes;
``BYTES`` tensors are a sequence of elements, each a 4-byte little-endian
length followed by that many bytes (as ``tritonclient.utils.serialize_byte_tensor``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.serve.decode import load_json

__all__ = [
    "DATATYPES",
    "V2Tensor",
    "decode_bytes_elements",
    "decode_tensor",
    "dtype_to_datatype",
    "encode_bytes_elements",
    "encode_response",
    "split_body",
    "tensor_bytes",
]

# v2 datatype -> numpy dtype (little-endian); BYTES is handled separately
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
_FROM_NUMPY = {v: k for k, v in DATATYPES.items()}
_LEN = struct.Struct("<I")


def dtype_to_datatype(dtype: str | np.dtype[Any] | None) -> str:
    """The v2 datatype of a numpy dtype name; anything else (strings, objects, unknown) is BYTES."""
    if dtype is None:
        return "BYTES"
    return _FROM_NUMPY.get(np.dtype(dtype).name if not isinstance(dtype, str) else dtype, "BYTES")


def encode_bytes_elements(items: Sequence[bytes]) -> bytes:
    """Serialize BYTES elements: 4-byte little-endian length + the bytes, for each element."""
    return b"".join(_LEN.pack(len(b)) + b for b in items)


def tensor_bytes(datatype: str, value: Any) -> bytes:
    """The raw data of an output tensor: BYTES elements serialized, numeric arrays little-endian row-major."""
    if datatype == "BYTES":
        return encode_bytes_elements(value)
    return np.ascontiguousarray(value, dtype=np.dtype(value.dtype).newbyteorder("<")).tobytes()


def decode_bytes_elements(buf: bytes | memoryview, field: str, shape: Sequence[int] | None = None) -> list[bytes]:
    """Split a serialized BYTES tensor into its elements; errors name the tensor and the offset.

    With ``shape``, an element past the count the shape holds is refused before it is split: each
    element costs a bytes object (~35 bytes for a 2-byte element), so splitting them all before
    comparing the count would cost ~7x the data."""
    view = memoryview(buf)
    out: list[bytes] = []
    pos = 0
    limit = math.prod(shape) if shape is not None else None
    while pos < len(view):
        if limit is not None and len(out) == limit:
            raise InputError(
                f"{field}: BYTES data holds more than the {limit} element{'s' if limit != 1 else ''} of shape "
                f"{list(shape or ())} (element {limit + 1} starts at offset {pos})",
                field=field,
                fix="make shape match the number of elements in data",
            )
        if pos + 4 > len(view):
            raise InputError(
                f"{field}: BYTES data ends inside an element length at offset {pos} ({len(view)} bytes)",
                field=field,
                fix="prefix each element with its 4-byte little-endian length",
            )
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > len(view):
            raise InputError(
                f"{field}: BYTES element at offset {pos - 4} declares {n} bytes but only {len(view) - pos} remain",
                field=field,
                fix="prefix each element with its 4-byte little-endian length",
            )
        out.append(bytes(view[pos : pos + n]))
        pos += n
    return out


def split_body(body: bytes, header_length: str | None, *, max_depth: int = 32) -> tuple[dict[str, Any], memoryview]:
    """Parse the JSON header of a v2 request; return it and the binary tail after it."""
    if header_length is None:
        json_part, tail = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if n < 0 or n > len(body):
            raise InputError(
                f"Inference-Header-Content-Length is {header_length!r} but the body has {len(body)} bytes",
                field="Inference-Header-Content-Length",
                fix="set it to the byte length of the JSON header that starts the body",
            )
        json_part, tail = body[:n], body[n:]
    header = load_json(
        json_part,
        max_depth=max_depth,
        what="the inference request header",
        fix='send a JSON object {"inputs": [...]} (with Inference-Header-Content-Length '
        "when binary tensor data follows it)",
    )
    if not isinstance(header, dict):
        raise InputError(
            f"the inference request is a JSON {type(header).__name__}, not an object",
            field="body",
            fix='send {"inputs": [{"name", "shape", "datatype", "data"}]}',
        )
    return header, memoryview(tail)


_MAX_RANK = 32  # numpy allows 64 dims; no model input needs more than a few


def _flatten(data: Any) -> list[Any]:
    """Nested lists → their leaves in row-major order (iterative: no recursion on hostile depth)."""
    out: list[Any] = []
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


@dataclass(frozen=True)
class V2Tensor:
    """One decoded request tensor: BYTES tensors hold a list of bytes, others a numpy array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    value: np.ndarray[Any, Any] | list[bytes]
    binary: bool = False  # sent as binary data (not JSON "data")


def _header(spec: Mapping[str, Any]) -> tuple[str, str, list[int], int | None]:
    """Check one input entry's name, datatype, shape and parameters; (name, datatype, shape, binary size)."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("an input tensor has no name", field="inputs", fix='give every entry of inputs a "name"')
    field = f"inputs.{name}"
    datatype = spec.get("datatype")
    if not isinstance(datatype, str) or (datatype != "BYTES" and datatype not in DATATYPES):
        raise InputError(
            f"{field}: unknown datatype {datatype!r}",
            field=name,
            fix=f"use one of BYTES, {', '.join(DATATYPES)}",
        )
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InputError(
            f"{field}: shape {shape!r} is not a list of non-negative ints",
            field=name,
            fix="send the tensor's shape, e.g. [1]",
        )
    if len(shape) > _MAX_RANK:
        raise InputError(
            f"{field}: shape has {len(shape)} dimensions, more than the {_MAX_RANK} supported",
            field=name,
            fix="send the tensor with its real rank (a few dimensions)",
        )
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError(
            f"{field}: parameters must be an object, got {type(params).__name__}",
            field=name,
            fix='send "parameters": {"binary_data_size": N} or leave it out',
        )
    size = params.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise InputError(
            f"{field}: binary_data_size {size!r} is not a byte count",
            field=name,
            fix="set binary_data_size to the byte size of this tensor's data",
        )
    return name, datatype, shape, size


def _binary_value(name: str, datatype: str, shape: list[int], raw: memoryview) -> tuple[Any, int]:
    field = f"inputs.{name}"
    if datatype == "BYTES":
        items = decode_bytes_elements(raw, field, shape)
        return items, len(items)
    count = math.prod(shape)
    itemsize = np.dtype(DATATYPES[datatype]).itemsize
    if len(raw) != count * itemsize:
        raise InputError(
            f"{field}: {len(raw)} bytes of binary data for shape {shape} {datatype} (expected {count * itemsize})",
            field=name,
            fix="make shape and datatype match the data sent",
        )
    return np.frombuffer(raw, dtype=np.dtype(DATATYPES[datatype]).newbyteorder("<")).reshape(shape), count


def _json_value(name: str, datatype: str, shape: list[int], data: Any) -> tuple[Any, int]:
    field = f"inputs.{name}"
    flat = _flatten(data)
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise InputError(
                f"{field}: BYTES data in JSON must be strings",
                field=name,
                fix="send strings, or binary data for raw bytes",
            )
        try:
            return [x.encode("utf-8") for x in flat], len(flat)
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{field}: a BYTES string holds a lone surrogate at index {exc.start}, which is not a character",
                field=name,
                fix="send valid Unicode strings (or binary data for raw bytes)",
            ) from None
    try:
        value = np.asarray(flat, dtype=DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(
            f"{field}: data does not fit datatype {datatype} ({exc})",
            field=name,
            fix=f"send numbers representable as {datatype}",
        ) from None
    return (value.reshape(shape) if len(flat) == math.prod(shape) else value), len(flat)


def decode_tensor(spec: Mapping[str, Any], tail: memoryview, offset: int) -> tuple[V2Tensor, int]:
    """Decode one entry of ``inputs``; return it and the new offset into the binary tail."""
    name, datatype, shape, size = _header(spec)
    field = f"inputs.{name}"
    if size is not None:
        if offset + size > len(tail):
            raise InputError(
                f"{field}: binary_data_size {size!r} at offset {offset} runs past the {len(tail)} bytes of binary data",
                field=name,
                fix="set binary_data_size to the byte size of this tensor's data",
            )
        value, got = _binary_value(name, datatype, shape, tail[offset : offset + size])
        offset += size
    elif "data" not in spec:
        raise InputError(
            f"{field}: no data and no binary_data_size parameter",
            field=name,
            fix='send "data": [...] or binary data with parameters.binary_data_size',
        )
    else:
        value, got = _json_value(name, datatype, shape, spec["data"])
    count = math.prod(shape)
    if got != count:
        raise InputError(
            f"{field}: shape {shape} needs {count} elements but {got} were sent",
            field=name,
            fix="make shape match the number of elements in data",
        )
    return V2Tensor(name, datatype, tuple(shape), value, binary=size is not None), offset


def _jsonable_element(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    return x


def encode_response(
    header: dict[str, Any], tensors: Sequence[tuple[dict[str, Any], Any, bool]]
) -> tuple[bytes, int | None]:
    """Build a v2 response body from ``(entry, value, binary)`` triples.

    ``entry`` holds name/datatype/shape; ``value`` is a numpy array (numeric) or a list of
    bytes (BYTES). Returns the body and the JSON header length (None: no binary part).
    """
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for entry, value, binary in tensors:
        out = dict(entry)
        if binary:
            raw = tensor_bytes(out["datatype"], value)
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif out["datatype"] == "BYTES":
            out["data"] = [b.decode("utf-8", errors="replace") for b in value]
        else:
            out["data"] = [_jsonable_element(x) for x in np.asarray(value).reshape(-1).tolist()]
        outputs.append(out)
    head = json.dumps({**header, "outputs": outputs}, ensure_ascii=False).encode("utf-8")
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)
