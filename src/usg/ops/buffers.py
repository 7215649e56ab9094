"""Memory reused across requests for the large arrays an op makes per request (det's input).

A fresh multi-megabyte numpy array is fresh memory from the kernel: glibc maps each allocation
above its mmap threshold anew and unmaps it when it is freed, so every request pays for the page
faults and the zeroing of pages it then overwrites. On the document graph that was ~12 ms of
system CPU per request for each 22 MB float32 page (benchmarks/README.md, issue #21, session 12).
:class:`BufferPool` hands out uninitialised arrays whose memory goes back to the pool when the
last view of them is gone, and gives it to the next array that fits.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Uninitialised C-contiguous arrays on reused memory.

    ``keep`` / ``max_bytes``: how many free buffers, and how many bytes in all, the pool holds at most
    (the longest-free buffer is dropped beyond them; one larger than ``max_bytes`` is never kept).
    An array from :meth:`empty` owns nothing: its memory is a pool buffer, shown to numpy through a
    memoryview that every view of the array keeps alive (numpy's ``base`` chain); when the last of
    them is freed the buffer returns to the pool. Whatever references the array's memory through
    numpy (views, ``np.asarray``, an ONNX Runtime ``OrtValue`` made from it) keeps the buffer out of
    the pool; a copy does not need it."""

    def __init__(self, keep: int = 4, max_bytes: int = 128 << 20) -> None:
        self.keep, self.max_bytes = keep, max_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.RLock()  # an array freed inside empty() returns its buffer on this thread
        self.reused = 0
        self.allocated = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
        """Like ``np.empty(shape, dtype)``, on a pool buffer when one fits."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        buf = None
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                buf = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
                self.reused += 1
        if buf is None:
            buf = np.empty(max(nbytes, 1), np.uint8)
            self.allocated += 1
        flat = np.frombuffer(buf.data[:nbytes], dtype=dt)
        if not isinstance(flat.base, memoryview) or not flat.flags.writeable:
            return np.empty(shape, dt)  # a numpy that keeps the buffer otherwise: no reuse, never wrong
        weakref.finalize(flat.base, self._give_back, buf)
        return flat.reshape(shape)

    def _give_back(self, buf: np.ndarray) -> None:
        if buf.nbytes > self.max_bytes:
            return
        with self._lock:
            self._free.append(buf)
            while len(self._free) > self.keep or sum(b.nbytes for b in self._free) > self.max_bytes:
                self._free.pop(0)
