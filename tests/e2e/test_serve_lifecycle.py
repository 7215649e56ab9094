"""A real ``usg serve`` under SIGTERM (drain, none lost, exit 0), a 10x burst (429, bounded RSS), timeouts."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from harness import Server


async def _post_all(url: str, texts: list[str], timeout: float = 30.0) -> list[tuple[int, float, httpx.Response]]:
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(text: str) -> tuple[int, float, httpx.Response]:
            t0 = time.perf_counter()
            r = await client.post(f"{url}/v1/infer", json={"inputs": {"text": text}})
            return r.status_code, time.perf_counter() - t0, r

        return list(await asyncio.gather(*(one(t) for t in texts)))


def test_sigterm_finishes_accepted_requests_answers_new_ones_503_and_exits_0(
    serve: Callable[..., Server], slow_graph: Path
) -> None:
    server = serve(slow_graph, "--max-inflight", "8")

    async def scenario() -> tuple[list[tuple[int, float, httpx.Response]], list[httpx.Response]]:
        task = asyncio.ensure_future(_post_all(server.url, [f"sleep:1.5 req{i}" for i in range(4)]))
        # wait until the server holds all four, then ask it to stop
        deadline = time.monotonic() + 10
        async with httpx.AsyncClient(timeout=5) as probe:
            while time.monotonic() < deadline:
                metrics = (await probe.get(f"{server.url}/metrics")).text
                if "usg_inflight_requests 4.0" in metrics:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the four slow requests never were in flight together")
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.08)
        # draining: requests arriving now get 503 with a JSON body, not connection resets
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=5, limits=limits) as late:
            lates = []
            for i in range(10):
                lates.append(await late.post(f"{server.url}/v1/infer", json={"inputs": {"text": f"late{i}"}}))
                await asyncio.sleep(0.002)
            ready = await late.get(f"{server.url}/v2/health/ready")
            assert ready.status_code == 503 and ready.json()["state"] == "draining"
        return await task, lates

    results, lates = asyncio.run(scenario())
    assert [code for code, _, _ in results] == [200, 200, 200, 200]
    assert sorted(r.json()["outputs"]["echo"] for _, _, r in results) == [f"sleep:1.5 req{i}" for i in range(4)]
    assert [r.status_code for r in lates] == [503] * 10
    assert all(r.json()["error"] == "draining" and r.headers["connection"] == "close" for r in lates)
    assert server.proc.wait(timeout=20) == 0, server.output()


def test_burst_of_10x_capacity_gets_fast_429s_and_bounded_memory(
    serve: Callable[..., Server], slow_graph: Path
) -> None:
    capacity = 4
    server = serve(slow_graph, "--max-inflight", str(capacity))
    # warm up (first request imports the node function), then measure
    asyncio.run(_post_all(server.url, ["warm"]))
    rss_before = server.rss_kib()
    payload = "sleep:0.8 " + "x" * 100_000  # 100 kB per request (slow.yaml raises limits.max_text_chars)
    results = asyncio.run(_post_all(server.url, [payload] * (10 * capacity)))
    rss_after = server.rss_kib()
    ok = [(t, r) for code, t, r in results if code == 200]
    rejected = [(t, r) for code, t, r in results if code == 429]
    assert len(ok) + len(rejected) == len(results), sorted({c for c, _, _ in results})
    assert capacity <= len(ok) <= 2 * capacity
    assert len(rejected) >= 8 * capacity
    assert all(r.json()["outputs"]["length"] == len(payload) for _, r in ok)
    # refused without waiting for a slot: every 429 came back before any admitted request finished
    assert max(t for t, _ in rejected) < min(t for t, _ in ok)
    assert all(r.headers["retry-after"] == "1" and r.json()["error"] == "overloaded" for _, r in rejected)
    assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)  # KiB
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'usg_rejected_requests_total{{reason="overloaded"}} {float(len(rejected))}' in metrics


def test_request_past_the_deadline_is_504(serve: Callable[..., Server], slow_graph: Path) -> None:
    server = serve(slow_graph, "--timeout", "0.5")
    r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "sleep:1.0 late"}}, timeout=10)
    assert r.status_code == 504 and r.json()["error"] == "timeout"
    r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "fast"}}, timeout=10)
    assert r.status_code == 200
