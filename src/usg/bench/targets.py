"""What ``usg bench`` sends load to: a graph run in process, or a running ``usg serve`` URL."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from usg.bench.breakdown import BreakdownObserver, ModelBreakdown, breakdown_from_metrics
from usg.bench.samples import Sample
from usg.errors import BackendError, MissingDependency, UsageError
from usg.graph.model import Graph

__all__ = ["InProcessTarget", "UrlTarget", "is_url"]


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


class InProcessTarget:
    """A graph in a USG :class:`~usg.runtime.Executor` in this process.

    ``batching=False`` and ``gate=1`` make the *sequential* baseline: the same models,
    one request at a time, one backend call per item.
    """

    def __init__(
        self, graph: Graph, *, name: str = "usg", batching: bool = True, gate: int | None = None, cache: bool = False
    ) -> None:
        from usg.runtime import Executor

        self.name = name
        self.graph = graph
        self.observer = BreakdownObserver()
        # the node cache is off unless asked: cycling over a few samples would measure cache hits
        self.executor = Executor(graph, batching=batching, observers=[self.observer], cache=cache)
        self._gate_size = gate
        self._gate: asyncio.Semaphore | None = None

    async def start(self) -> None:
        await self.executor.start()
        self.observer.bind_runners(self.executor.runners)
        if self._gate_size:
            self._gate = asyncio.Semaphore(self._gate_size)

    async def infer(self, sample: Sample) -> dict[str, Any]:
        if self._gate is None:
            result = await self.executor.infer(sample.inputs())
        else:
            async with self._gate:
                result = await self.executor.infer(sample.inputs())
        return dict(result.outputs)

    def mark(self) -> None:
        """Start of a measured window: forget what the warm-up did."""
        self.observer.reset()

    def breakdown(self) -> list[ModelBreakdown]:
        return self.observer.snapshot()

    async def aclose(self) -> None:
        await self.executor.aclose()


def cache_hits(metrics: str) -> float:
    """Node-cache hits in a ``/metrics`` text (``usg_cache_lookups_total{..., outcome="hit"}``, summed)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("usg_cache_lookups_total{") and 'outcome="hit"' in line:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


class UrlTarget:
    """A running ``usg serve``: ``POST /v1/infer`` (JSON, base64 PNG images); the per-model
    breakdown is the difference of ``/metrics`` scraped before and after the measured window."""

    def __init__(self, url: str, *, name: str = "usg", timeout_s: float = 120.0) -> None:
        try:
            parts = urlsplit(url.rstrip("/"))
            parts.port  # noqa: B018 -- raises ValueError for a port outside 0-65535
        except ValueError as exc:
            raise UsageError(
                f"{url!r} is not a usable URL ({exc}); fix: pass the URL `usg serve` printed, e.g. http://127.0.0.1:8000"
            ) from None
        base_path = parts.path[: -len("/v1/infer")] if parts.path.endswith("/v1/infer") else parts.path
        self.base = urlunsplit((parts.scheme, parts.netloc, base_path, "", ""))
        self.name = name
        self.timeout_s = timeout_s
        self._client: Any = None
        self._before = ""
        self._requests_at_mark = 0
        self._requests = 0
        #: node-cache hits the server counted in the last measured window (its /metrics)
        self.last_cache_hits = 0.0

    async def start(self) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingDependency("httpx", "serve", "benchmarking a server URL") from None
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        self._client = httpx.AsyncClient(base_url=self.base, timeout=self.timeout_s, limits=limits)
        try:
            resp = await self._client.get("/metrics")
        except httpx.HTTPError as exc:
            await self._client.aclose()
            raise UsageError(
                f"cannot reach a server at {self.base} ({type(exc).__name__}: {exc}); "
                "fix: start `usg serve GRAPH` first (it prints its URL), or check the host and port"
            ) from None
        if resp.status_code >= 400:
            self._before = ""

    async def infer(self, sample: Sample) -> dict[str, Any]:
        resp = await self._client.post("/v1/infer", json={"inputs": sample.json_inputs()})
        if resp.status_code >= 400:
            raise BackendError(
                f"{self.base}/v1/infer answered {resp.status_code}: {resp.text[:300]}; "
                "fix: the server's message says what it refused (check --graph and --inputs match the served graph)"
            )
        self._requests += 1
        body = resp.json()
        return dict(body.get("outputs", {}))

    async def scrape(self) -> str:
        resp = await self._client.get("/metrics")
        return str(resp.text) if resp.status_code < 400 else ""

    async def mark(self) -> None:
        self._before = await self.scrape()
        self._requests_at_mark = self._requests

    async def breakdown_async(self) -> list[ModelBreakdown]:
        after = await self.scrape()
        if not after:
            return []
        self.last_cache_hits = max(0.0, cache_hits(after) - cache_hits(self._before))
        return breakdown_from_metrics(self._before, after, self._requests - self._requests_at_mark)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
