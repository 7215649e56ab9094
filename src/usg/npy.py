"""Read a ``.npy`` tensor input (``usg run -i x=FILE.npy``, a multipart upload) within bounds.

``np.load`` allocates the array its header declares before it reads the data: a 128-byte
file declaring ``shape: (10000000000,)`` is a ``MemoryError`` (74.5 GiB), and one declaring a
few GiB is an allocation of that size. :func:`load_npy` reads the header first and refuses a
declaration larger than the bytes that follow it, an object array, or a file that is not
``.npy`` at all, each with a :class:`ValueError` that says which.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

__all__ = ["load_npy"]

_MAGIC = b"\x93NUMPY"


def load_npy(source: bytes | Path) -> np.ndarray:
    """The array in ``source`` (the bytes of a ``.npy`` file, or its path); ``ValueError`` if it is not one."""
    if isinstance(source, Path):
        with source.open("rb") as fh:
            return _load(fh, source.stat().st_size)
    return _load(io.BytesIO(source), len(source))


def _load(fh: io.BufferedIOBase | io.BytesIO, size: int) -> np.ndarray:
    head = fh.read(len(_MAGIC))
    if head != _MAGIC:
        shown = head.hex() if head else "nothing: the file is empty"
        raise ValueError(f"it does not start like a .npy file (first bytes {shown})")
    fh.seek(0)
    try:
        major, _ = np.lib.format.read_magic(fh)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, tokenize.TokenError...
        raise ValueError(f"its header does not parse ({exc})") from None
    if dtype.hasobject:
        raise ValueError("it holds an object array (loading it would unpickle code)")
    declared = math.prod(shape) * dtype.itemsize
    following = size - fh.tell()
    if declared > following:
        raise ValueError(
            f"its header declares shape {tuple(shape)} {dtype} ({declared:,} bytes) but only {following:,} bytes "
            "follow (a truncated or forged file)"
        )
    data = fh.read(declared)
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()
