"""Load generator statistics with a fake target: counts, percentiles, errors, rejections."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from usg.bench.loadgen import LoadResult, is_rejection, percentile, run_closed, run_open
from usg.bench.samples import Sample
from usg.errors import Overloaded


class FakeTarget:
    """Answers after ``delay_s``; every ``fail_every``-th call raises, every ``reject_every``-th is refused."""

    name = "fake"

    def __init__(self, delay_s: float = 0.01, fail_every: int = 0, reject_every: int = 0) -> None:
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.reject_every = reject_every
        self.calls = 0
        self.inflight = 0
        self.max_inflight = 0

    async def infer(self, sample: Sample) -> dict[str, str]:
        self.calls += 1
        n = self.calls
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail_every and n % self.fail_every == 0:
                raise RuntimeError("boom")
            if self.reject_every and n % self.reject_every == 0:
                raise Overloaded("queue full", retry_after=0.1, why="queue_full:fake")
            return {"text": sample.name}
        finally:
            self.inflight -= 1


def samples():
    return itertools.cycle([Sample("a", None, "x")])


def test_closed_loop_keeps_concurrency_and_measures_latency():
    target = FakeTarget(delay_s=0.02)
    res = asyncio.run(run_closed(target, samples(), concurrency=4, duration_s=0.5, warmup_s=0.1))
    assert target.max_inflight == 4
    assert res.mode == "closed" and res.concurrency == 4
    # closed loop: each of the 4 clients sends its next request when the last one returns, so
    # over the 0.5 s window completed ≈ 4 × 0.5 s / mean latency (Little's law) — whatever the
    # machine's load does to the latency itself (a loaded CI machine stretches the 20 ms sleeps)
    mean_s = sum(res.latencies_ms) / len(res.latencies_ms) / 1e3
    expected = 4 * 0.5 / mean_s
    assert 0.7 * expected - 4 <= res.completed <= 1.1 * expected + 4, (res.completed, expected)
    assert res.throughput == pytest.approx(res.completed / 0.5)
    assert res.p(50) >= 19.0  # the fake sleeps 20 ms: a shorter latency would be mis-measured
    assert res.p(50) <= res.p(95) <= res.p(99)
    assert res.errors == 0 and res.rejected == 0


def test_warmup_requests_are_not_counted():
    target = FakeTarget(delay_s=0.05)
    res = asyncio.run(run_closed(target, samples(), concurrency=1, duration_s=0.3, warmup_s=0.3))
    assert target.calls >= res.completed + 5  # warm-up calls happened but were left out
    assert res.completed <= 7


def test_errors_and_rejections_are_counted_separately():
    target = FakeTarget(delay_s=0.005, fail_every=5, reject_every=7)
    res = asyncio.run(run_closed(target, samples(), concurrency=2, duration_s=0.4, warmup_s=0.0))
    assert res.errors > 0 and res.rejected > 0
    assert res.attempts == res.completed + res.errors + res.rejected
    assert res.error_rate == pytest.approx(res.errors / res.attempts)
    assert "RuntimeError: boom" in res.error_samples[0]


def test_open_loop_poisson_rate():
    target = FakeTarget(delay_s=0.001)
    res = asyncio.run(run_open(target, samples(), rate=200.0, duration_s=1.0, warmup_s=0.1, seed=1))
    assert res.mode == "open" and res.rate == 200.0
    assert 140 <= res.completed <= 260  # Poisson(200) in 1 s
    assert res.rejected == 0


def test_open_loop_over_capacity_rejects_at_the_client():
    target = FakeTarget(delay_s=0.5)
    res = asyncio.run(run_open(target, samples(), rate=100.0, duration_s=0.4, warmup_s=0.0, max_inflight=5))
    assert res.rejected > 10
    assert target.max_inflight <= 5


def test_percentile_and_summary_of_empty_result():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    res = LoadResult("s", "closed", 1, None, 1.0)
    s = res.summary()
    assert s["completed"] == 0 and s["throughput_rps"] == 0.0
    assert res.error_rate == 0.0


def test_is_rejection_recognises_overload_and_http_429():
    class Resp:
        status_code = 429

    class HTTPErr(Exception):
        response = Resp()

    assert is_rejection(Overloaded("x", retry_after=1, why="w"))
    assert is_rejection(HTTPErr())
    assert not is_rejection(RuntimeError("x"))
