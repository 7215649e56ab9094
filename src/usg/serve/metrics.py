"""Prometheus metrics of a served graph, fed by executor hooks (an :class:`Observer`).

Every app gets its own ``CollectorRegistry``, so several apps (tests) never clash.
Items/s is ``rate(usg_model_items_total[1m])``; the padding-waste ratio of a model over
a window is ``rate(usg_batch_padded_elements_total - usg_batch_real_elements_total) /
rate(usg_batch_padded_elements_total)`` (each batch's ratio is also in a histogram).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from usg.runtime.observer import CacheEvent, NodeEvent, Observer
from usg.serve.label_cache import LabelCache
from usg.serve.llm_metrics import LLMMetrics

if TYPE_CHECKING:
    from usg.runtime.batcher import BatchEvent

__all__ = ["CONTENT_TYPE_LATEST", "ServeMetrics", "modality_label"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_RATIO = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
REJECT_REASONS = ("overloaded", "too_large", "bad_input", "timeout", "draining", "unauthorized", "slow_client")


def modality_label(modalities: Sequence[str]) -> str:
    """``["text", "image"]`` → ``"image+text"`` (sorted; ``"none"`` when empty)."""
    return "+".join(sorted(modalities)) or "none"


class ServeMetrics(Observer):
    """Batch size, queue wait, compute, padding waste and items per model; request latency by
    modality set; pruned nodes; in-flight and rejected requests."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.child = LabelCache()  # child(metric, *labels): a labelled metric's child, made once
        self.batch_size = Histogram(
            "usg_batch_size",
            "Items per backend call of a batching model.",
            ["model"],
            buckets=_SIZES,
            registry=r,
        )
        self.queue_wait = Histogram(
            "usg_model_queue_wait_seconds",
            "Time an item waited for its model (batch window or a free instance).",
            ["model"],
            buckets=_FAST,
            registry=r,
        )
        self.compute = Histogram(
            "usg_model_compute_seconds",
            "Backend time of one model call (one batch when batching).",
            ["model"],
            buckets=_FAST,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "usg_batch_padding_waste_ratio",
            "(padded - real) / padded elements of one batch.",
            ["model"],
            buckets=_RATIO,
            registry=r,
        )
        self.real_elements = Counter(
            "usg_batch_real_elements", "Real (unpadded) input elements batched.", ["model"], registry=r
        )
        self.padded_elements = Counter(
            "usg_batch_padded_elements", "Input elements batched after padding.", ["model"], registry=r
        )
        self.items = Counter(
            "usg_model_items", "Items a model processed (rate() gives items/s).", ["model"], registry=r
        )
        self.remote_retries = Counter(
            "usg_remote_retries",
            "Calls to a remote replica (Ray engine) retried because the replica failed or was unreachable.",
            ["target"],
            registry=r,
        )
        self.remote_bytes = Counter(
            "usg_remote_bytes",
            "Payload bytes of calls between the router and its replicas (Ray engine), by direction "
            "(request | reply) and transport (grpc | object_store | inline).",
            ["target", "direction", "transport"],
            registry=r,
        )
        self.node_seconds = Histogram(
            "usg_node_seconds",
            "Wall time of a node within a request.",
            ["node"],
            buckets=_LATENCY,
            registry=r,
        )
        self.request_seconds = Histogram(
            "usg_request_seconds",
            "Executor latency of a request.",
            ["modalities", "status"],
            buckets=_LATENCY,
            registry=r,
        )
        self.pruned = Counter(
            "usg_pruned_nodes", "Nodes skipped because a request lacked their inputs.", ["node"], registry=r
        )
        self.inflight = Gauge("usg_inflight_requests", "HTTP inference requests being handled.", registry=r)
        self.rejected = Counter("usg_rejected_requests", "Requests refused, by reason.", ["reason"], registry=r)
        self.http_requests = Counter(
            "usg_http_requests",
            "HTTP inference requests by endpoint and status code.",
            ["endpoint", "code"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "usg_model_queue_depth", "Items waiting in a model's batch queue.", ["model"], registry=r
        )
        self.batch_cap = Gauge(
            "usg_batch_cap",
            "Most items one batch may hold now (the controller's cap, else max_size).",
            ["model"],
            registry=r,
        )
        self.batch_wait = Gauge(
            "usg_batch_wait_seconds",
            "Longest wait for a batch to fill now (controller's, else max_delay_ms).",
            ["model"],
            registry=r,
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self._batched: set[str] = set()
        self.cache_lookups = Counter(
            "usg_cache_lookups",
            "Node-cache steps: hit, miss, coalesced (served by a concurrent identical request), store, error.",
            ["node", "outcome"],
            registry=r,
        )
        self.cache_hit_seconds = Histogram(
            "usg_cache_hit_seconds", "Lookup + decode time of a node-cache hit.", ["node"], buckets=_FAST, registry=r
        )
        self.cache_bytes = Gauge("usg_cache_bytes", "Bytes a node-cache store holds (memory).", ["store"], registry=r)
        self.cache_evictions = Counter("usg_cache_evictions", "Node-cache LRU evictions.", ["store"], registry=r)
        self._evictions_seen: dict[str, int] = {}
        self.llm = LLMMetrics(
            r, self.child
        )  # LLM nodes: time to first token, inter-token latency, tokens, engine codes

    def bind_runners(self, runners: Mapping[str, Any]) -> None:
        """Learn which models batch (their queue/compute come from batch events) and export queue depth."""
        self.llm.bind(runners)
        for name, runner in runners.items():
            if runner.batches:
                self._batched.add(name)
            if hasattr(runner, "queue_depth"):
                self.queue_depth.labels(name).set_function(_depth_of(runner))
            if hasattr(runner, "batch_cap"):
                self.batch_cap.labels(name).set_function(_cap_of(runner))
                self.batch_wait.labels(name).set_function(_wait_of(runner))

    def bind_gate(self, gate: Any) -> None:
        """Export the executor's CPU gate (:class:`usg.runtime.cpu_gate.CpuGate`): its slots and, per
        model, its rank and the calls that waited for a core or went past an earlier waiter."""
        self.registry.register(_GateCollector(gate))

    def set_inflight_source(self, source: Callable[[], float]) -> None:
        self.inflight.set_function(source)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- observer hooks ------------------------------------------------------------------------
    def node_finished(self, event: NodeEvent) -> None:
        self.child(self.node_seconds, event.node).observe(max(0.0, event.end - event.start))
        if event.engine_calls:
            self.llm.observe(event.node, event.engine_calls)
        if event.model is None or not event.ok:
            return
        self.child(self.items, event.model).inc(event.items)
        if event.model not in self._batched and event.items > 0:
            # one backend call per item: the event carries sums over a map node's items,
            # so record each call's mean (as the batched path records one value per call)
            n = event.items
            for _ in range(n):
                self.child(self.queue_wait, event.model).observe(event.queue_ms / n / 1e3)
                self.child(self.compute, event.model).observe(event.compute_ms / n / 1e3)

    def batch_finished(self, event: BatchEvent) -> None:
        model = event.model
        self.child(self.batch_size, model).observe(event.items)
        self.child(self.compute, model).observe(event.compute_ms / 1e3)
        wait = self.child(self.queue_wait, model)
        for q in event.queue_ms:
            wait.observe(q / 1e3)
        if event.padded_elements > 0:
            self.child(self.real_elements, model).inc(event.real_elements)
            self.child(self.padded_elements, model).inc(event.padded_elements)
            waste = (event.padded_elements - event.real_elements) / event.padded_elements
            self.child(self.padding_ratio, model).observe(max(0.0, waste))

    def cache_event(self, event: CacheEvent) -> None:
        self.child(self.cache_lookups, event.node, event.outcome).inc()
        if event.outcome == "hit":
            self.child(self.cache_hit_seconds, event.node).observe(event.seconds)
        self.child(self.cache_bytes, event.store).set(event.bytes_held)
        seen = self._evictions_seen.get(event.store, 0)
        if event.evictions > seen:
            self.child(self.cache_evictions, event.store).inc(event.evictions - seen)
            self._evictions_seen[event.store] = event.evictions

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        self.child(self.request_seconds, modality_label(modalities), status).observe(seconds)
        for node in pruned:
            self.child(self.pruned, node).inc()

    def http_request(self, endpoint: str, status: int) -> None:
        self.child(self.http_requests, endpoint, str(status)).inc()

    def reject(self, reason: str) -> None:
        self.child(self.rejected, reason).inc()

    def remote_retry(self, target: str) -> None:
        self.child(self.remote_retries, target).inc()

    def remote_bytes_moved(self, target: str, direction: str, transport: str, size: int) -> None:
        self.child(self.remote_bytes, target, direction, transport).inc(size)


def _depth_of(runner: Any) -> Callable[[], float]:
    return lambda: float(runner.queue_depth)


def _cap_of(runner: Any) -> Callable[[], float]:
    return lambda: float(runner.batch_cap)


def _wait_of(runner: Any) -> Callable[[], float]:
    return lambda: float(runner.batch_wait_ms) / 1e3


class _GateCollector(Collector):
    """``usg_cpu_gate_*``: read from the gate's counters at each scrape."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate

    def collect(self) -> Any:
        g = self.gate
        slots = GaugeMetricFamily("usg_cpu_gate_slots", "Single-threaded CPU model calls allowed at once (0: no cap).")
        slots.add_metric([], float(g.slots))
        yield slots
        rank = GaugeMetricFamily(
            "usg_cpu_gate_rank",
            "A model's distance to the graph's outputs; a freed core goes to the waiting call of the lowest.",
            labels=["model"],
        )
        calls = CounterMetricFamily("usg_cpu_gate_calls", "Model calls through the CPU gate.", labels=["model"])
        waited = CounterMetricFamily(
            "usg_cpu_gate_waited_calls", "Calls through the CPU gate that waited for a core.", labels=["model"]
        )
        wait_s = CounterMetricFamily(
            "usg_cpu_gate_wait_seconds", "Time calls waited for a core at the CPU gate.", labels=["model"]
        )
        overtook = CounterMetricFamily(
            "usg_cpu_gate_overtakes",
            "Cores handed to a call of this model before an earlier waiting call of another model.",
            labels=["model"],
        )
        for model, r in sorted(g.ranks.items()):
            rank.add_metric([model], float(r))
        for model in sorted(g.calls):
            calls.add_metric([model], float(g.calls[model]))
            waited.add_metric([model], float(g.waited[model]))
            wait_s.add_metric([model], float(g.wait_s[model]))
            overtook.add_metric([model], float(g.overtook[model]))
        yield from (rank, calls, waited, wait_s, overtook)
