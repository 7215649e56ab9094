"""usg.ops.buffers.BufferPool: reused memory, never while any view of an array handed out is alive."""

from __future__ import annotations

import gc

import numpy as np

from usg.ops.buffers import BufferPool


def test_a_freed_array_gives_its_memory_to_the_next_that_fits() -> None:
    pool = BufferPool()
    a = pool.empty((2, 3, 4), np.float32)
    assert a.shape == (2, 3, 4) and a.dtype == np.float32 and a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"]
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = pool.empty((1, 3, 4), np.float32)  # smaller: fits in the freed buffer
    assert b.__array_interface__["data"][0] == address
    assert (pool.allocated, pool.reused) == (1, 1)


def test_memory_is_not_reused_while_a_view_of_the_array_is_alive() -> None:
    pool = BufferPool()
    a = pool.empty((4, 5), np.float32)
    a[:] = 7.0
    views = [a[1], a.view(np.ndarray), np.asarray(a).reshape(-1)[3:], a.view(np.int32)]
    del a
    gc.collect()
    for _ in range(3):
        b = pool.empty((4, 5), np.float32)
        b[:] = -1.0
        assert not any(np.shares_memory(b, v) for v in views)
    assert np.all(views[0] == 7.0) and np.all(views[2] == 7.0)
    del views, b
    gc.collect()
    c = pool.empty((4, 5), np.float32)
    assert pool.reused >= 1 and c.size == 20


def test_the_pool_keeps_a_bounded_number_of_bytes() -> None:
    pool = BufferPool(keep=2, max_bytes=1000)
    arrays = [pool.empty((50,), np.float32) for _ in range(4)]  # 200 B each
    big = pool.empty((500,), np.float32)  # 2000 B: above max_bytes, never kept
    del arrays, big
    gc.collect()
    assert len(pool._free) == 2 and all(b.nbytes == 200 for b in pool._free)
