"""OpenTelemetry spans for requests and nodes, built from executor hooks (an :class:`Observer`).

One ``usg.request`` span per request (child of the caller's ``traceparent`` when the
HTTP layer passes it on), one ``node <name>`` span per node run, and for model nodes
two children, ``queue`` and ``compute``, laid end to end from the node's start using the
executor's measured queue wait and compute time (sums over items for ``map`` nodes,
clamped to the node's wall time). An LLM node has instead one ``engine <model>`` child per
request sent to its engine, carrying the engine's request id, status, tokens and time to first token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from usg.errors import MissingDependency
from usg.records import EngineCall
from usg.runtime.observer import NodeEvent, Observer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["TracingObserver", "make_tracer_provider"]


def make_tracer_provider(exporter: str, *, service_name: str = "usg") -> TracerProvider:
    """A tracer provider exporting to ``console`` (stdout) or ``otlp`` (OTLP/HTTP, env-configured)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise MissingDependency("opentelemetry-sdk", "serve", "tracing (--otel)") from None
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise MissingDependency(
                "opentelemetry-exporter-otlp-proto-http", "serve", "exporting traces over OTLP (--otel otlp)"
            ) from None
        span_exporter = OTLPSpanExporter()
    else:
        raise ValueError(f"unknown span exporter {exporter!r}; use 'console' or 'otlp'")
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider


def _to_epoch_ns(perf: float, offset_ns: int) -> int:
    return int(perf * 1e9) + offset_ns


class TracingObserver(Observer):
    """Turns executor hooks into spans on ``provider`` (the app's own, not the global one)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("usg.serve")
        self._requests: dict[str, Span] = {}

    @contextlib.contextmanager
    def remote_parent(self, headers: Mapping[str, str]) -> Iterator[None]:
        """Make the caller's W3C ``traceparent`` (if any) the parent of request spans started inside."""
        from opentelemetry import context, propagate

        token = context.attach(propagate.extract(dict(headers)))
        try:
            yield
        finally:
            context.detach(token)

    def request_started(self, request_id: str, modalities: Sequence[str]) -> None:
        span = self.tracer.start_span(
            "usg.request",
            attributes={"usg.request_id": request_id, "usg.modalities": "+".join(sorted(modalities))},
        )
        self._requests[request_id] = span

    def request_integrity(self, request_id: str, integrity: Mapping[str, str]) -> None:
        span = self._requests.get(request_id)
        if span is not None:
            for name, digest in integrity.items():
                span.set_attribute(f"usg.input.{name}.sha256", digest)

    def node_finished(self, event: NodeEvent) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        parent = self._requests.get(event.request_id)
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        offset = time.time_ns() - time.perf_counter_ns()
        start = _to_epoch_ns(event.start, offset)
        end = max(start, _to_epoch_ns(event.end, offset))
        attrs: dict[str, Any] = {"usg.node": event.node, "usg.kind": event.kind, "usg.items": event.items}
        if event.model is not None:
            attrs.update(
                {
                    "usg.model": event.model,
                    "usg.queue_ms": round(event.queue_ms, 3),
                    "usg.compute_ms": round(event.compute_ms, 3),
                }
            )
        span = self.tracer.start_span(f"node {event.node}", context=ctx, attributes=attrs, start_time=start)
        if not event.ok:
            span.set_status(Status(StatusCode.ERROR))
        for call in event.engine_calls:
            self._engine_span(call, trace.set_span_in_context(span), offset)
        if event.model is not None and not event.engine_calls:
            child_ctx = trace.set_span_in_context(span)
            q_end = min(end, start + int(event.queue_ms * 1e6))
            c_end = min(end, q_end + int(event.compute_ms * 1e6))
            model_attr = {"usg.model": event.model}
            self.tracer.start_span("queue", context=child_ctx, attributes=model_attr, start_time=start).end(
                end_time=q_end
            )
            self.tracer.start_span("compute", context=child_ctx, attributes=model_attr, start_time=q_end).end(
                end_time=c_end
            )
        span.end(end_time=end)

    def _engine_span(self, call: EngineCall, ctx: Any, offset: int) -> None:
        """``engine <model>``: one request to a generation engine, with the engine's request id."""
        from opentelemetry.trace import Status, StatusCode

        start = _to_epoch_ns(call.start, offset)
        attrs: dict[str, Any] = {
            "usg.model": call.model,
            "usg.engine.url": call.url,
            "usg.engine.request_id": call.engine_request_id,
            "http.response.status_code": call.status,
            "usg.engine.completion_tokens": call.completion_tokens,
        }
        if call.prompt_tokens is not None:
            attrs["usg.engine.prompt_tokens"] = call.prompt_tokens
        if call.first_token is not None:
            attrs["usg.engine.ttft_ms"] = round((call.first_token - call.start) * 1e3, 3)
        if call.finish_reason is not None:
            attrs["usg.engine.finish_reason"] = call.finish_reason
        span = self.tracer.start_span(f"engine {call.model}", context=ctx, attributes=attrs, start_time=start)
        if call.error is not None:
            span.set_status(Status(StatusCode.ERROR, call.error[:200]))
        span.end(end_time=max(start, _to_epoch_ns(call.end, offset)))

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._requests.pop(request_id, None)
        if span is None:
            return
        span.set_attribute("usg.status", status)
        if pruned:
            span.set_attribute("usg.pruned_nodes", list(pruned))
        if status != "ok":
            span.set_status(Status(StatusCode.ERROR, status))
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()
