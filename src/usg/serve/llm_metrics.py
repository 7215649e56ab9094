"""Prometheus metrics of LLM nodes (``backend: openai``), from the engine calls a node reports
(:class:`usg.records.EngineCall`): time to first token, inter-token latency, tokens in and out,
the engine's status codes, engine request time, and requests at the engine now.

``rate(usg_llm_completion_tokens_total[1m])`` is the tokens/s a node gets from its engine; the
status-code counter's ``code="none"`` counts calls the engine never answered (down, timed out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from usg.records import EngineCall
from usg.serve.label_cache import LabelCache, observe_many

__all__ = ["LLMMetrics"]

_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_CALL = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class LLMMetrics:
    """Per LLM node: TTFT, inter-token latency, tokens, engine status codes; per model: in flight."""

    def __init__(self, registry: CollectorRegistry, child: LabelCache | None = None) -> None:
        r = registry
        self.child = child or LabelCache()
        labels = ["model", "node"]
        self.ttft = Histogram(
            "usg_llm_time_to_first_token_seconds",
            "From sending a request to the engine to its first content delta (streamed calls).",
            labels,
            buckets=_TTFT,
            registry=r,
        )
        self.itl = Histogram(
            "usg_llm_inter_token_latency_seconds",
            "Gap between consecutive content deltas the engine streamed.",
            labels,
            buckets=_ITL,
            registry=r,
        )
        self.call_seconds = Histogram(
            "usg_llm_engine_request_seconds",
            "Wall time of one request to the engine (one attempt).",
            labels,
            buckets=_CALL,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "usg_llm_prompt_tokens", "Prompt tokens the engine reported (usage).", labels, registry=r
        )
        self.completion_tokens = Counter(
            "usg_llm_completion_tokens",
            "Tokens the engine generated (its usage, else the content deltas counted).",
            labels,
            registry=r,
        )
        self.engine_requests = Counter(
            "usg_llm_engine_requests",
            "Requests sent to the engine by HTTP status it answered (none: never answered).",
            [*labels, "code"],
            registry=r,
        )
        self.inflight = Gauge(
            "usg_llm_engine_inflight",
            "Requests at the engine now (at most options.max_inflight).",
            ["model"],
            registry=r,
        )

    def bind(self, runners: Mapping[str, Any]) -> None:
        """Export the in-flight count of every engine-backed model."""
        for name, runner in runners.items():
            backend = getattr(runner, "backend", None)
            if backend is not None and getattr(backend, "kind", "") == "openai" and hasattr(backend, "inflight"):
                self.inflight.labels(name).set_function(_inflight_of(backend))

    def observe(self, node: str, calls: tuple[EngineCall, ...]) -> None:
        for call in calls:
            model = call.model
            self.child(self.engine_requests, model, node, str(call.status) if call.status else "none").inc()
            self.child(self.call_seconds, model, node).observe(max(0.0, call.end - call.start))
            if call.first_token is not None:
                self.child(self.ttft, model, node).observe(max(0.0, call.first_token - call.start))
            if call.token_gaps_s:
                observe_many(self.child(self.itl, model, node), call.token_gaps_s)
            if call.prompt_tokens:
                self.child(self.prompt_tokens, model, node).inc(call.prompt_tokens)
            if call.completion_tokens:
                self.child(self.completion_tokens, model, node).inc(call.completion_tokens)


def _inflight_of(backend: Any) -> Callable[[], float]:
    return lambda: float(backend.inflight)
