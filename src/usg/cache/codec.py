"""Node results to bytes and back without pickle, so a poisoned store cannot run code.

Layout: ``USGC1`` magic, an 8-byte little-endian header length, a JSON header, then each
array as an 8-byte length and an ``.npy`` file written with ``allow_pickle=False``. The
header describes the value tree: arrays as ``{"$a": i}``, numpy scalars ``{"$s": i}``,
bytes ``{"$b": base64}``, tuples ``{"$t": [...]}``, dicts ``{"$d": [[k, v], ...]}`` (keys
keep their type). The header also names the key the value was stored under; a value read
back under another key is rejected. Anything else (an object array, a custom class) is not
cacheable: :class:`CodecError`.
"""

from __future__ import annotations

import base64
import io
import json
import math
import struct
from typing import Any

import numpy as np

__all__ = ["CodecError", "decode", "encode"]

_MAGIC = b"USGC1"


class CodecError(ValueError):
    """A value cannot be encoded, or stored bytes do not decode to a value."""


def _pack(value: Any, arrays: list[np.ndarray[Any, Any]]) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CodecError("an object array is not cacheable")
        arrays.append(value)
        return {"$a": len(arrays) - 1}
    if isinstance(value, np.generic):
        arrays.append(np.asarray(value))
        return {"$s": len(arrays) - 1}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [_pack(v, arrays) for v in value]
    if isinstance(value, tuple):
        return {"$t": [_pack(v, arrays) for v in value]}
    if isinstance(value, dict):
        return {"$d": [[_pack(k, arrays), _pack(v, arrays)] for k, v in value.items()]}
    raise CodecError(f"a {type(value).__name__} is not cacheable")


def encode(key: str, value: Any) -> bytes:
    arrays: list[np.ndarray[Any, Any]] = []
    tree = _pack(value, arrays)
    header = json.dumps({"key": key, "value": tree}, separators=(",", ":")).encode()
    out = io.BytesIO()
    out.write(_MAGIC + struct.pack("<Q", len(header)) + header)
    for arr in arrays:
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getbuffer()
        out.write(struct.pack("<Q", len(data)))
        out.write(data)
    return out.getvalue()


def _unpack(node: Any, arrays: list[np.ndarray[Any, Any]]) -> Any:
    if isinstance(node, list):
        return [_unpack(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) != 1:
        raise CodecError("malformed header node")
    ((tag, body),) = node.items()
    if tag == "$a":
        return arrays[body]
    if tag == "$s":
        return arrays[body][()]
    if tag == "$b":
        return base64.b64decode(body, validate=True)
    if tag == "$t":
        return tuple(_unpack(v, arrays) for v in body)
    if tag == "$d":
        return {_unpack(k, arrays): _unpack(v, arrays) for k, v in body}
    raise CodecError(f"unknown header tag {tag!r}")


def decode(key: str, data: bytes) -> Any:
    """The value stored under ``key``; :class:`CodecError` for anything malformed."""
    try:
        view = memoryview(data)
        if bytes(view[:5]) != _MAGIC:
            raise CodecError("not a USG cache value (bad magic)")
        (hlen,) = struct.unpack("<Q", view[5:13])
        header = json.loads(bytes(view[13 : 13 + hlen]))
        if not isinstance(header, dict) or header.get("key") != key:
            raise CodecError("the value was stored under another key")
        pos = 13 + hlen
        arrays: list[np.ndarray[Any, Any]] = []
        while pos < len(view):
            (n,) = struct.unpack("<Q", view[pos : pos + 8])
            if pos + 8 + n > len(view):
                raise CodecError("truncated array")
            arrays.append(_load_array(view[pos + 8 : pos + 8 + n]))
            pos += 8 + n
        return _unpack(header["value"], arrays)
    except CodecError:
        raise
    # RecursionError: a header nested past the interpreter's limit (in json.loads or _unpack)
    except (ValueError, KeyError, IndexError, TypeError, struct.error, OSError, EOFError, RecursionError) as exc:
        raise CodecError(f"stored bytes do not decode: {type(exc).__name__}: {str(exc)[:200]}") from None


def _load_array(frame: memoryview) -> np.ndarray[Any, Any]:
    """One ``.npy`` frame → its array; the size its header declares must be the bytes that follow
    it (np.load allocates the declared size before reading: a forged shape would cost that memory)."""
    f = io.BytesIO(frame)
    major, _ = np.lib.format.read_magic(f)
    if major == 1:
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    if dtype.hasobject:
        raise CodecError("stored bytes do not decode: an object array (never unpickled)")
    declared = math.prod(shape) * dtype.itemsize
    if declared != len(frame) - f.tell():
        raise CodecError(
            f"array header declares shape {shape} {dtype} ({declared} bytes) but {len(frame) - f.tell()} bytes follow"
        )
    return np.load(io.BytesIO(frame), allow_pickle=False)
