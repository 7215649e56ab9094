"""Executor overhead: a chain of no-op Python nodes in USG vs a chain of no-op Ray Serve deployments.

Per-hop overhead is the p50 latency of a request through the chain divided by its length
(and, for USG, the marginal cost (p50(chain n) − p50(chain 1)) / (n − 1)), measured
sequentially (one request at a time) so it is the latency floor, not a throughput figure.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from usg.graph.model import Graph

__all__ = ["chain_graph", "measure_ray", "measure_usg", "noop"]


def noop(x: Any) -> dict[str, Any]:
    """A node that hands its input on unchanged."""
    return {"x": x}


def chain_graph(n: int) -> Graph:
    from usg.graph import GraphBuilder

    b = GraphBuilder(f"chain{n}").input("x", "tensor")
    prev = "inputs.x"
    for i in range(n):
        b.node(f"n{i}", fn="usg.bench.overhead:noop", inputs={"x": prev})
        prev = f"n{i}.x"
    return b.output("x", prev).build()


async def _time(call: Any, requests: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        await call()
    out = []
    for _ in range(requests):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def measure_usg(n: int = 10, requests: int = 2000, warmup: int = 200) -> dict[str, float]:
    from usg.runtime import Executor

    x = np.zeros(4, dtype=np.float32)
    p50: dict[int, float] = {}
    for length in (1, n):
        async with Executor(chain_graph(length)) as ex:

            async def call(ex: Executor = ex) -> None:
                await ex.infer({"x": x})

            p50[length] = float(np.percentile(await _time(call, requests, warmup), 50))
    return {
        "chain_p50_us": p50[n],
        "per_hop_us": p50[n] / n,
        "marginal_per_hop_us": (p50[n] - p50[1]) / (n - 1),
    }


def measure_ray(n: int = 10, requests: int = 300, warmup: int = 30) -> dict[str, float]:
    """Chain of ``n`` Ray Serve deployments (each calls the next through a DeploymentHandle),
    and a single handle call, both from the driver."""
    from ray import serve

    from usg.bench.baselines.ray_serve import ray_session

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
    class Hop:
        def __init__(self, nxt: Any = None) -> None:
            self.nxt = nxt

        async def __call__(self, x: Any) -> Any:
            if self.nxt is None:
                return x
            return await self.nxt.remote(x)

    ray_session()
    app: Any = Hop.options(name="hop0").bind()  # type: ignore[attr-defined]
    for i in range(1, n):
        app = Hop.options(name=f"hop{i}").bind(app)  # type: ignore[attr-defined]
    x = np.zeros(4, dtype=np.float32)
    try:
        chain = serve.run(app, name="usg_overhead_chain", route_prefix=None)
        single = serve.run(Hop.options(name="single").bind(), name="usg_overhead_one", route_prefix=None)  # type: ignore[attr-defined]

        async def run() -> tuple[list[float], list[float]]:
            async def c() -> None:
                await chain.remote(x)

            async def s() -> None:
                await single.remote(x)

            return await _time(c, requests, warmup), await _time(s, requests, warmup)

        chain_us, single_us = asyncio.run(run())
    finally:
        from usg.scale.ray_app import stop_private_ray

        serve.shutdown()
        stop_private_ray()
    c50 = float(np.percentile(chain_us, 50))
    return {"chain_p50_us": c50, "per_hop_us": c50 / n, "single_call_p50_us": float(np.percentile(single_us, 50))}
