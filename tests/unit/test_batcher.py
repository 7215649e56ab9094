"""Batching invariants on fake backends: grouping, padding, budgets, poison isolation, overload."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from usg.errors import BackendError, InputError, Overloaded
from usg.graph import BatchPolicy, PadPolicy
from usg.runtime.batcher import BatchingRunner
from usg.runtime.padding import next_size
from usg.runtime.runner import DirectRunner
from usg.testing import FakeBackend


def summer() -> FakeBackend:
    """Row sums: padding with zeros does not change a row's sum."""
    return FakeBackend(lambda i: {"s": i["x"].sum(axis=tuple(range(1, i["x"].ndim)))[:, None]})


async def run_items(policy, items, backend, concurrency=1, listeners=None):
    pool = ThreadPoolExecutor(4)
    runner = BatchingRunner("m", backend, pool, policy, concurrency=concurrency, listeners=listeners)
    await runner.start()
    try:
        return await asyncio.gather(*(runner.submit(it) for it in items), return_exceptions=True)
    finally:
        await runner.stop()
        pool.shutdown()


def test_same_shape_items_from_many_callers_share_one_batch():
    fake = summer()
    items = [{"x": np.full((1, 4), i, np.float32)} for i in range(8)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=50), items, fake))
    assert [float(o["s"][0, 0]) for o in outs] == [4.0 * i for i in range(8)]
    assert [c["x"].shape[0] for c in fake.calls] == [8]


def test_unequal_shapes_are_not_mixed_without_a_pad_policy():
    fake = summer()
    items = [{"x": np.ones((1, w), np.float32)} for w in (3, 5, 3, 5, 3)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=30), items, fake))
    assert [float(o["s"][0, 0]) for o in outs] == [3, 5, 3, 5, 3]
    assert sorted(c["x"].shape for c in fake.calls) == [(2, 5), (3, 3)]


def test_pad_safe_model_pads_to_multiple_and_results_are_unchanged():
    fake = summer()
    pad = PadPolicy(axes={"x": (1,)}, multiple=8)
    items = [{"x": np.arange(1, w + 1, dtype=np.float32)[None]} for w in (3, 9, 5)]
    events = []
    outs = asyncio.run(
        run_items(
            BatchPolicy(max_size=8, max_delay_ms=30, pad=pad, max_pad_waste=1.0), items, fake, listeners=[events.append]
        )
    )
    assert [float(o["s"][0, 0]) for o in outs] == [6.0, 45.0, 15.0]
    assert [c["x"].shape for c in fake.calls] == [(3, 16)]
    (ev,) = events
    assert ev.items == 3 and ev.real_elements == 17 and ev.padded_elements == 48


def test_padding_waste_bound_keeps_batches_tight():
    fake = summer()
    pad = PadPolicy(axes={"x": (1,)}, multiple=8)
    items = [{"x": np.ones((1, w), np.float32)} for w in (3, 9, 5)]
    asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=30, pad=pad, max_pad_waste=0.35), items, fake))
    # all three would be 37% padding (17 real of 27): the 9 goes alone
    assert sorted(c["x"].shape for c in fake.calls) == [(1, 16), (2, 8)]


def test_buckets_and_token_budget_split_batches():
    assert next_size(100, PadPolicy(axes={}, buckets=(160, 320))) == 160
    assert next_size(400, PadPolicy(axes={}, buckets=(160, 320), multiple=32)) == 416
    fake = summer()
    pad = PadPolicy(axes={"x": (1,)}, buckets=(8, 16, 32))
    items = [{"x": np.ones((1, w), np.float32)} for w in (30, 30, 30, 6, 6)]
    asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=30, pad=pad, max_tokens=64), items, fake))
    # the budget of 64 padded tokens allows at most 2 rows padded to the 32 bucket
    shapes = sorted(c["x"].shape for c in fake.calls)
    assert all(r * w <= 64 for r, w in shapes)
    assert sum(r for r, _ in shapes) == 5


def test_items_are_ordered_by_length_inside_the_window():
    fake = summer()
    pad = PadPolicy(axes={"x": (1,)}, multiple=8)
    items = [{"x": np.ones((1, w), np.float32)} for w in (5, 50, 6, 48)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=2, max_delay_ms=50, pad=pad), items, fake))
    assert [float(o["s"][0, 0]) for o in outs] == [5, 50, 6, 48]
    assert sorted(c["x"].shape for c in fake.calls) == [(2, 8), (2, 56)]


def test_preferred_sizes_cut_batches():
    fake = summer()
    items = [{"x": np.ones((1, 2), np.float32)} for _ in range(7)]
    asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=30, preferred_sizes=(2, 4)), items, fake))
    assert fake.calls[0]["x"].shape[0] == 4


def test_equal_items_run_oldest_first_and_unequal_rows_by_length():
    # one shape and one length (a stream's windows): each batch takes the oldest items, in order
    fake = summer()
    items = [{"x": np.full((1, 2), i, np.float32)} for i in range(10)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=4, max_delay_ms=30, preferred_sizes=(1, 2, 4)), items, fake))
    assert [float(o["s"][0, 0]) for o in outs] == [2.0 * i for i in range(10)]
    assert [c["x"][:, 0].tolist() for c in fake.calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # the same shape past the batch axis but more rows: the oldest, then the items nearest its length
    fake = summer()
    items = [{"x": np.full((n, 2), n, np.float32)} for n in (3, 1, 2, 1)]
    asyncio.run(run_items(BatchPolicy(max_size=3, max_delay_ms=30), items, fake))
    assert [c["x"][:, 0].tolist() for c in fake.calls] == [[3, 3, 3, 2, 2, 1], [1]]


def test_poison_item_fails_alone_and_the_rest_of_its_batch_succeeds():
    def handler(inp):
        if (inp["x"] < 0).any():
            raise ValueError("negative input")
        return {"s": inp["x"].sum(axis=1, keepdims=True)}

    fake = FakeBackend(handler)
    items = [{"x": np.full((1, 2), v, np.float32)} for v in (1, 2, -1, 4, 5, 6)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=8, max_delay_ms=30), items, fake))
    assert isinstance(outs[2], BackendError) and "negative input" in str(outs[2])
    assert [float(o["s"][0, 0]) for i, o in enumerate(outs) if i != 2] == [2, 4, 8, 10, 12]
    assert fake.calls[0]["x"].shape[0] == 6  # it was batched, then split


def test_full_queue_is_refused_with_retry_after():
    async def main():
        pool = ThreadPoolExecutor(2)
        fake = FakeBackend(lambda i: {"s": i["x"]})
        runner = BatchingRunner("m", fake, pool, BatchPolicy(max_size=2, max_delay_ms=1000, max_queue=3))
        await runner.start()
        first = [asyncio.create_task(runner.submit({"x": np.ones((1, 1), np.float32) * k})) for k in range(1)]
        await asyncio.sleep(0)
        # queue holds 1 (waiting for a partner); fill to 3, then the 4th is refused
        more = [asyncio.create_task(runner.submit({"x": np.ones((1, 2), np.float32)})) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="queue is full") as exc:
            await runner.submit({"x": np.ones((1, 3), np.float32)})
        assert exc.value.retry_after > 0 and exc.value.status == 429
        await runner.stop()
        await asyncio.gather(*first, *more)
        pool.shutdown()

    asyncio.run(main())


def test_batch_that_changes_batch_size_is_a_clear_error():
    fake = FakeBackend(lambda i: {"s": np.zeros((i["x"].shape[0] + 1, 1), np.float32)})
    items = [{"x": np.ones((1, 2), np.float32)} for _ in range(3)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=4, max_delay_ms=30), items, fake))
    assert len(outs) == 3
    for out in outs:
        with pytest.raises(
            BackendError, match=r"model 'm': batched output 's' has 2 rows for a batch of 1; .*preserve"
        ):
            raise out


def test_batch_a_backend_shrinks_is_retried_item_by_item():
    # the batch of 3 returns 1 row (wrong), each item alone returns 1 row (right)
    events = []
    fake = FakeBackend(lambda i: {"s": np.zeros((1, 1), np.float32)})
    items = [{"x": np.ones((1, 2), np.float32)} for _ in range(3)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=4, max_delay_ms=30), items, fake, listeners=[events.append]))
    assert [o["s"].shape for o in outs] == [(1, 1)] * 3
    assert [(e.items, e.ok) for e in events] == [(3, False), (1, True), (1, True), (1, True)]


class SlowFake(FakeBackend):
    """Every call sleeps ``call_s``; an item with a negative value fails (or, ``hang``, blocks until
    released or ``hang_s``). Records each call's size and the peak number of calls in flight."""

    def __init__(self, call_s: float = 0.2, hang: bool = False, hang_s: float = 6.0) -> None:
        super().__init__(self._handle)
        self.call_s, self.hang, self.hang_s = call_s, hang, hang_s
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inflight = self.peak = 0
        self.sizes: list[int] = []

    def _handle(self, inp):
        with self.lock:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            self.sizes.append(int(inp["x"].shape[0]))
        try:
            if (inp["x"] < 0).any():
                if self.hang:
                    self.release.wait(self.hang_s)
                else:
                    time.sleep(self.call_s)
                    raise ValueError("negative input")
            time.sleep(self.call_s)
            return {"s": inp["x"].sum(axis=1, keepdims=True)}
        finally:
            with self.lock:
                self.inflight -= 1


def sixteen_with_one_bad():
    return [{"x": np.full((1, 2), -1.0 if k == 5 else k, np.float32)} for k in range(16)]


def test_a_failing_batch_retries_every_item_alone_in_one_parallel_round():
    # 200 ms calls, one bad item among 16: the batch call, then all 16 alone at once (two rounds
    # of calls, not the five of halving 16 → 8 → 4 → 2 → 1)
    fake = SlowFake(call_s=0.2)
    outs = asyncio.run(run_items(BatchPolicy(max_size=16, max_delay_ms=50), sixteen_with_one_bad(), fake))
    assert isinstance(outs[5], BackendError) and "negative input" in str(outs[5])
    assert [float(o["s"][0, 0]) for i, o in enumerate(outs) if i != 5] == [2.0 * k for k in range(16) if k != 5]
    assert fake.sizes[0] == 16 and sorted(fake.sizes[1:]) == [1] * 16  # the bad item ran twice in all
    assert fake.peak == 16  # the single-item retries ran in one round, not one after another


def test_a_hanging_item_fails_alone_at_call_timeout_and_frees_the_slot():
    async def main():
        fake = SlowFake(call_s=0.02, hang=True)
        pool = ThreadPoolExecutor(4)
        policy = BatchPolicy(max_size=16, max_delay_ms=20)
        runner = BatchingRunner("m", fake, pool, policy, concurrency=1, call_timeout_s=0.3)
        await runner.start()
        try:
            outs = await asyncio.gather(*(runner.submit(it) for it in sixteen_with_one_bad()), return_exceptions=True)
            # the hung calls (the batch and the item's retry) still block their threads, yet the
            # model's only slot is free: a new item is answered before the hang ends
            later = await runner.submit({"x": np.full((1, 2), 7.0, np.float32)})
            assert not fake.release.is_set() and fake.inflight == 2
        finally:
            fake.release.set()
            await runner.stop()
            pool.shutdown()
        return outs, later

    outs, later = asyncio.run(main())
    bad = outs[5]
    assert isinstance(bad, BackendError)
    with pytest.raises(BackendError, match=r"model 'm' did not answer .* call_timeout_ms=300.*models\.m\.options"):
        raise bad
    assert all(not isinstance(o, Exception) for i, o in enumerate(outs) if i != 5)
    assert float(later["s"][0, 0]) == 14.0


def test_direct_runner_call_timeout_fails_the_call_and_frees_the_slot():
    async def main():
        fake = SlowFake(call_s=0.01, hang=True)
        pool = ThreadPoolExecutor(2)
        runner = DirectRunner("m", fake, pool, concurrency=1, call_timeout_s=0.1)
        try:
            with pytest.raises(BackendError, match=r"call_timeout_ms=100"):
                await runner.submit({"x": np.full((1, 2), -1.0, np.float32)})
            ok = await runner.submit({"x": np.ones((1, 2), np.float32)})
        finally:
            fake.release.set()
            pool.shutdown()
        return ok

    assert float(asyncio.run(main())["s"][0, 0]) == 2.0


def test_a_fan_out_is_admitted_whole_and_only_other_requests_see_the_queue_full():
    async def main():
        pool = ThreadPoolExecutor(2)
        fake = FakeBackend(lambda i: {"s": i["x"]})
        runner = BatchingRunner("m", fake, pool, BatchPolicy(max_size=4, max_delay_ms=1000, max_queue=3))
        await runner.start()
        try:
            items = [{"x": np.full((1, 1), k, np.float32)} for k in range(10)]
            fan_out = asyncio.create_task(runner.submit_many(items, [None] * 10))
            await asyncio.sleep(0)
            assert runner.queue_depth >= 6  # ten items admitted at once (less what already ran)
            with pytest.raises(Overloaded, match=r"queue is full \(\d+ items waiting, limit 3\)"):
                await runner.submit({"x": np.ones((1, 1), np.float32)})
            outs = await fan_out
        finally:
            await runner.stop()
            pool.shutdown()
        return outs

    assert [float(o["s"][0, 0]) for o in asyncio.run(main())] == [float(k) for k in range(10)]


def test_a_usg_error_raised_by_the_backend_keeps_its_type():
    def handler(inp):
        if (inp["x"] < 0).any():
            raise InputError("negative input", field="x", fix="send x >= 0")
        return {"s": inp["x"]}

    items = [{"x": np.full((1, 1), v, np.float32)} for v in (1, -1, 2)]
    outs = asyncio.run(run_items(BatchPolicy(max_size=4, max_delay_ms=30), items, FakeBackend(handler)))
    assert type(outs[1]) is InputError and outs[1].status == 400
    assert [float(o["s"][0, 0]) for i, o in enumerate(outs) if i != 1] == [1.0, 2.0]
