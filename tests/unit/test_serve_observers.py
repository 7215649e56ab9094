"""Metrics and tracing observers, fed by a real executor on fake backends."""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("opentelemetry.sdk", reason="needs the serve extra: pip install -e '.[serve]'")

import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install 'usg[serve]'")
pytest.importorskip("opentelemetry.sdk", reason="needs the serve extra: pip install 'usg[serve]'")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import usg.serve
from usg.runtime.batcher import BatchEvent
from usg.serve import ServeMetrics, TracingObserver, create_app, make_tracer_provider
from usg.serve.metrics import modality_label

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve_app import doubler, tiny_graph


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_after_requests() -> None:
    app = create_app(tiny_graph(), backends={"m": doubler()})
    with TestClient(app) as c:
        assert c.post("/v1/infer", json={"inputs": {"text": "abc"}}).status_code == 200
        assert c.post("/v1/infer", json={"inputs": {"text": "abc", "x": [[1.0]]}}).status_code == 200
        assert c.post("/v1/infer", json={"inputs": {"nope": 1}}).status_code == 400
        r = c.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    s = samples(r.text)
    assert s[("usg_request_seconds_count", (("modalities", "text"), ("status", "ok")))] == 1
    assert s[("usg_request_seconds_count", (("modalities", "tensor+text"), ("status", "ok")))] == 1
    assert s[("usg_pruned_nodes_total", (("node", "shape"),))] == 2
    assert s[("usg_pruned_nodes_total", (("node", "dblx"),))] == 1
    assert s[("usg_model_items_total", (("model", "m"),))] == 3
    assert s[("usg_batch_size_count", (("model", "m"),))] >= 1
    assert s[("usg_batch_size_sum", (("model", "m"),))] == 3
    assert s[("usg_rejected_requests_total", (("reason", "bad_input"),))] == 1
    assert s[("usg_inflight_requests", ())] == 0
    assert s[("usg_http_requests_total", (("code", "200"), ("endpoint", "v1_infer")))] == 2
    assert ("usg_model_queue_depth", (("model", "m"),)) in s


def test_padding_waste_ratio() -> None:
    m = ServeMetrics()
    m.batch_finished(
        BatchEvent("enc", 2, 2, real_elements=60, padded_elements=80, queue_ms=(1.0, 2.0), compute_ms=5.0, ok=True)
    )
    s = samples(m.render().decode())
    assert s[("usg_batch_padding_waste_ratio_sum", (("model", "enc"),))] == 0.25
    assert s[("usg_batch_padded_elements_total", (("model", "enc"),))] == 80
    assert s[("usg_model_queue_wait_seconds_count", (("model", "enc"),))] == 2


def test_modality_label() -> None:
    assert modality_label(["text", "image"]) == "image+text"
    assert modality_label([]) == "none"


def test_spans_per_request_node_queue_and_compute() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(tiny_graph(), backends={"m": doubler()}, tracer_provider=provider)
    with TestClient(app) as c:
        headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        assert c.post("/v1/infer", json={"inputs": {"text": "abc"}}, headers=headers).status_code == 200
    spans = exporter.get_finished_spans()
    by_name = {s.name: s for s in spans}
    req = by_name["usg.request"]
    assert req.attributes is not None and req.attributes["usg.modalities"] == "text"
    assert req.attributes["usg.input.text.sha256"] == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert req.parent is not None and f"{req.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    for node in ("up", "len", "dbl"):
        assert by_name[f"node {node}"].parent.span_id == req.context.span_id  # type: ignore[union-attr]
    dbl = by_name["node dbl"]
    children = [s for s in spans if s.parent is not None and s.parent.span_id == dbl.context.span_id]
    assert sorted(s.name for s in children) == ["compute", "queue"]
    queue = next(s for s in children if s.name == "queue")
    compute = next(s for s in children if s.name == "compute")
    assert dbl.start_time <= queue.start_time <= queue.end_time <= compute.start_time <= compute.end_time
    assert compute.end_time <= dbl.end_time  # type: ignore[operator]
    assert "node shape" not in by_name  # pruned nodes get no span


def test_console_provider() -> None:
    provider = make_tracer_provider("console", service_name="usg:t")
    assert isinstance(TracingObserver(provider).provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "usg:t"
    provider.shutdown()


def test_otlp_provider_uses_the_otlp_http_exporter() -> None:
    trace_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    provider = make_tracer_provider("otlp", service_name="usg:t")
    try:
        processors = provider._active_span_processor._span_processors  # the SDK keeps no public accessor
        assert [type(p.span_exporter) for p in processors] == [trace_exporter.OTLPSpanExporter]  # type: ignore[attr-defined]
    finally:
        provider.shutdown()


def test_missing_otlp_exporter_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    from usg.errors import MissingDependency

    with pytest.raises(MissingDependency, match=r"pip install 'usg\[serve\]'"):
        make_tracer_provider("otlp")


def test_serve_all_is_sorted_and_importable() -> None:
    assert usg.serve.__all__ == sorted(usg.serve.__all__)
    for name in usg.serve.__all__:
        assert hasattr(usg.serve, name)
