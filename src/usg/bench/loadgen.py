"""Load generation: closed loop (N clients, each sends its next request when the last returns)
and open loop (Poisson arrivals at a fixed rate), with a warm-up that is not measured.

A *target* is anything with ``async def infer(sample) -> outputs``; errors it raises are
counted (``Overloaded`` and HTTP 429/503 count as rejections), never fatal to the run.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from usg.bench.samples import Sample

__all__ = ["LoadResult", "Target", "is_rejection", "percentile", "run_closed", "run_open"]

ProgressFn = Callable[[float], None]  # fraction of the run done, 0..1


class Target(Protocol):
    name: str

    async def infer(self, sample: Sample) -> Any: ...


def is_rejection(exc: BaseException) -> bool:
    """Overload answers (retry later) as opposed to failures."""
    from usg.errors import Overloaded

    if isinstance(exc, Overloaded):
        return True
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    return status in (429, 503)


def percentile(values: list[float] | np.ndarray, q: float) -> float:
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


@dataclass
class LoadResult:
    """What one load run measured (warm-up excluded)."""

    system: str
    mode: str  # "closed" | "open"
    concurrency: int | None
    rate: float | None
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    rejected: int = 0
    error_samples: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return len(self.latencies_ms)

    @property
    def attempts(self) -> int:
        return self.completed + self.errors + self.rejected

    @property
    def throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    @property
    def error_rate(self) -> float:
        return self.errors / self.attempts if self.attempts else 0.0

    @property
    def rejection_rate(self) -> float:
        return self.rejected / self.attempts if self.attempts else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "mode": self.mode,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "duration_s": round(self.duration_s, 3),
            "completed": self.completed,
            "throughput_rps": self.throughput,
            "p50_ms": self.p(50),
            "p95_ms": self.p(95),
            "p99_ms": self.p(99),
            "error_rate": self.error_rate,
            "rejection_rate": self.rejection_rate,
            "errors": self.errors,
            "rejected": self.rejected,
            "error_samples": self.error_samples[:3],
            **self.extra,
        }


class _Recorder:
    def __init__(self, result: LoadResult, measure_from: float, measure_to: float) -> None:
        self.result = result
        self.measure_from = measure_from
        self.measure_to = measure_to

    async def one(self, target: Target, sample: Sample) -> None:
        t0 = time.perf_counter()
        try:
            await target.infer(sample)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.measure_from <= time.perf_counter() <= self.measure_to:
                if is_rejection(exc):
                    self.result.rejected += 1
                else:
                    self.result.errors += 1
                    if len(self.result.error_samples) < 5:
                        self.result.error_samples.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        t1 = time.perf_counter()
        # a request counts when it finished inside the window (throughput = completions / window)
        if self.measure_from <= t1 <= self.measure_to:
            self.result.latencies_ms.append((t1 - t0) * 1e3)


async def _progress_ticker(start: float, total: float, progress: ProgressFn | None) -> None:
    if progress is None:
        return
    while True:
        progress(min(1.0, (time.perf_counter() - start) / total))
        await asyncio.sleep(0.25)


async def run_closed(
    target: Target,
    samples: Iterator[Sample],
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 2.0,
    on_measure_start: Callable[[], Awaitable[None] | None] | None = None,
    progress: ProgressFn | None = None,
) -> LoadResult:
    """``concurrency`` clients in a loop for ``warmup_s + duration_s``; only the last
    ``duration_s`` is measured (requests that finish inside it)."""
    start = time.perf_counter()
    result = LoadResult(target.name, "closed", concurrency, None, duration_s)
    rec = _Recorder(result, start + warmup_s, start + warmup_s + duration_s)
    end = rec.measure_to

    async def client() -> None:
        while time.perf_counter() < end:
            await rec.one(target, next(samples))

    ticker = asyncio.create_task(_progress_ticker(start, warmup_s + duration_s, progress))
    marker = asyncio.create_task(_at(rec.measure_from, on_measure_start))
    try:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    finally:
        ticker.cancel()
        marker.cancel()
        await asyncio.gather(ticker, marker, return_exceptions=True)
    return result


async def run_open(
    target: Target,
    samples: Iterator[Sample],
    *,
    rate: float,
    duration_s: float,
    warmup_s: float = 2.0,
    max_inflight: int = 1024,
    seed: int = 0,
    on_measure_start: Callable[[], Awaitable[None] | None] | None = None,
    progress: ProgressFn | None = None,
) -> LoadResult:
    """Poisson arrivals at ``rate`` requests/s; a request that would exceed ``max_inflight``
    outstanding requests is counted as rejected by the client (the system is saturated)."""
    rng = random.Random(seed)
    start = time.perf_counter()
    result = LoadResult(target.name, "open", None, rate, duration_s)
    rec = _Recorder(result, start + warmup_s, start + warmup_s + duration_s)
    tasks: set[asyncio.Task[None]] = set()
    ticker = asyncio.create_task(_progress_ticker(start, warmup_s + duration_s, progress))
    marker = asyncio.create_task(_at(rec.measure_from, on_measure_start))
    next_at = start
    try:
        while True:
            next_at += rng.expovariate(rate)
            if next_at >= rec.measure_to:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= max_inflight:
                if next_at >= rec.measure_from:
                    result.rejected += 1
                continue
            task = asyncio.create_task(rec.one(target, next(samples)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        # requests still running at the end are not counted (they finished after the window)
        remaining = rec.measure_to + 30.0 - time.perf_counter()
        if tasks:
            await asyncio.wait(set(tasks), timeout=max(0.1, remaining))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ticker.cancel()
        marker.cancel()
        await asyncio.gather(ticker, marker, return_exceptions=True)
    return result


async def _at(when: float, callback: Callable[[], Awaitable[None] | None] | None) -> None:
    if callback is None:
        return
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    out = callback()
    if out is not None:
        await out
