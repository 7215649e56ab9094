"""SLO attribution on a graph with an injected slow node: the executor in-process with the trace-file
observer, the report's figures, and its HTML and PDF (a page rendered to PNG)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("scipy")

from usg.errors import UsageError
from usg.graph import load_graph
from usg.monitor.otlp import read_traces
from usg.monitor.slo import attribute, critical_path, parse_slo, split_request
from usg.monitor.tracefile import TraceFileWriter
from usg.runtime import Executor

MONITOR = Path(__file__).resolve().parents[1] / "resources" / "monitor"
sys.path.insert(0, str(MONITOR))


def _texts(n: int) -> list[str]:
    return [f"sleep:0.9 slow request {i}" if i % 5 == 0 else f"total due {i} amount paid" for i in range(n)]


async def _run(path: Path, texts: list[str]) -> None:
    graph = load_graph(MONITOR / "graph.yaml")
    writer = TraceFileWriter(path, graph)
    sem = asyncio.Semaphore(2)  # two clients: sleeping nodes never take every worker thread
    async with Executor(graph, observers=[writer]) as ex:

        async def one(t: str) -> None:
            async with sem:
                await ex.infer({"text": t})

        await asyncio.gather(*(one(t) for t in texts))
    writer.close()


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slo") / "trace.jsonl"
    asyncio.run(_run(path, _texts(40)))
    return path


def test_trace_file_is_otlp_json_lines(trace_file: Path) -> None:
    lines = trace_file.read_text().splitlines()
    assert len(lines) == 40
    doc = json.loads(lines[0])
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    names = {s["name"] for s in spans}
    assert {"usg.request", "node feats", "node score", "node slow", "queue", "compute"} <= names
    score = next(s for s in spans if s["name"] == "node score")
    keys = {a["key"] for a in score["attributes"]}
    assert {"usg.queue_ms", "usg.batch_wait_ms", "usg.compute_ms", "usg.model"} <= keys
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)


def test_slow_node_takes_at_least_90_percent_of_the_violation_budget(trace_file: Path) -> None:
    requests = read_traces([trace_file])
    data = attribute(requests, parse_slo("p95<800ms"))
    assert data["requests"] == 40 and data["violating"] == 8 and not data["met"]
    assert next(iter(data["budget"]["per_node"])) == "slow"
    assert data["budget"]["per_node"]["slow"] >= 0.9
    assert data["budget"]["per_cause"]["compute"] >= 0.9
    worst = data["worst"][0]
    assert worst["critical_path"] == ["slow"]  # its only upstream is the graph input
    for r in requests:
        assert sum(split_request(r).values()) == pytest.approx(r.latency_ms, rel=1e-6, abs=1e-3)


def test_model_node_time_is_split_into_queue_batch_wait_compute(trace_file: Path) -> None:
    requests = read_traces([trace_file])
    fast = next(r for r in requests if r.latency_ms < 100)
    score = next(n for n in fast.nodes if n.node == "score")
    assert score.model == "scorer" and score.batch_wait_ms <= 2.0 + 1e-6 and score.compute_ms > 0
    path = [n.node for n, _, _ in critical_path(fast)]
    assert path in (["feats", "score"], ["embed"], ["slow"])  # one chain of the graph


def _pixels_png(png: bytes) -> np.ndarray[Any, Any]:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32)


def test_pdf_opens_and_has_the_plots(trace_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pymupdf = pytest.importorskip("pymupdf")
    from usg.monitor.slo_report import write_report

    requests = read_traces([trace_file])
    data = attribute(requests, parse_slo("p95<800ms"))
    out = tmp_path / "report.pdf"
    write_report(data, requests, out)
    with pymupdf.open(out) as pdf:
        assert pdf.page_count == 4  # summary, budget bars, latency CDF, timeline
        assert "slow" in pdf[0].get_text()
        for page in (pdf[1], pdf[2], pdf[3]):
            png = page.get_pixmap(dpi=60).tobytes("png")
            px = _pixels_png(png)
            assert px.std() > 5 and (px < 128).mean() > 0.005  # not blank: drawn marks on the page
            (tmp_path / f"page{page.number}.png").write_bytes(png)


def test_html_report_has_tables_and_three_plots(trace_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from usg.cli import cli

    out, js = tmp_path / "report.html", tmp_path / "report.json"
    res = CliRunner().invoke(
        cli,
        ["report", "slo", str(trace_file), "--slo", "p95<800ms", "-o", str(out), "--json-out", str(js)],
        standalone_mode=False,
    )
    assert res.exception is None, res.output
    assert "violation budget: slow" in res.output
    text = out.read_text()
    assert text.count("<img") == 3 and "data:image/png;base64," in text and "<td>slow</td>" in text
    assert json.loads(js.read_text())["budget"]["per_node"]["slow"] >= 0.9


def test_jaeger_and_tempo_shapes_are_read(trace_file: Path, tmp_path: Path) -> None:
    docs = [json.loads(line) for line in trace_file.read_text().splitlines()]
    jaeger = {"result": {"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}}
    tempo = {"batches": [rs for d in docs for rs in d["resourceSpans"]]}
    (tmp_path / "jaeger.json").write_text(json.dumps(jaeger))
    (tmp_path / "tempo.json").write_text(json.dumps(tempo))
    assert len(read_traces([tmp_path / "jaeger.json"])) == 40
    assert len(read_traces([tmp_path / "tempo.json"])) == 40


def test_bad_slo_and_empty_traces_say_the_fix(tmp_path: Path) -> None:
    from usg.errors import UsageError

    with pytest.raises(UsageError, match=r"--slo 'p95 800' is not an SLO; fix: write it like p95<800ms"):
        parse_slo("p95 800")
    assert parse_slo("p99 < 1.5s").threshold_ms == 1500
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(UsageError, match=r"no usg.request spans .*fix: record them with `usg serve --trace-file"):
        read_traces([tmp_path / "empty.json"])


def _otlp(spans: list) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})


ROOT = {"name": "usg.request", "traceId": "t", "spanId": "r", "startTimeUnixNano": 0, "endTimeUnixNano": 5_000_000}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("deep", "[" * 100_000 + "]" * 100_000, "JSON nested too deep to be a trace"),
        ("resource-spans-of-ints", json.dumps({"resourceSpans": [1]}), "no usg.request spans"),
        ("spans-a-string", json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": "abc"}]}]}), "no usg.request"),
        ("time-not-a-number", _otlp([{**ROOT, "startTimeUnixNano": "abc"}]), "1 could not be read, e.g. request span"),
        ("attributes-a-string", _otlp([{**ROOT, "attributes": "x"}]), "attributes is a str, not a list"),
    ],
)
def test_a_malformed_trace_file_is_a_usage_error_never_an_internal_one(tmp_path: Path, name, text, message) -> None:
    """Each was an internal error (RecursionError, AttributeError, ValueError, TypeError)."""
    (tmp_path / f"{name}.json").write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)):
        read_traces([tmp_path / f"{name}.json"])


def test_a_span_that_cannot_be_read_is_left_out_and_counted(tmp_path: Path) -> None:
    good = {"name": "node a", "traceId": "t", "spanId": "c1", "parentSpanId": "r", "startTimeUnixNano": 0}
    bad = {**good, "spanId": "c2", "attributes": [{"key": "usg.queue_ms", "value": {"stringValue": "abc"}}]}
    odd = {**ROOT, "spanId": "r2", "attributes": [{"key": "usg.request_id", "value": 5}]}  # a value not an object
    (tmp_path / "t.json").write_text(_otlp([ROOT, good, bad, odd]))
    skipped: list[str] = []
    requests = read_traces([tmp_path / "t.json"], skipped)
    assert [len(r.nodes) for r in requests] == [1, 0]
    assert skipped == ["node span 'c2': ValueError: could not convert string to float: 'abc'"]


def test_many_requests_without_trace_ids_are_read_in_linear_time(tmp_path: Path) -> None:
    """Every root span was matched against every span of its trace: 20 000 requests without a traceId
    (one bucket) took 19 s, and each root collected the others' parentless children."""
    spans = [{**ROOT, "traceId": None, "spanId": f"r{i}", "startTimeUnixNano": i} for i in range(20_000)]
    spans += [{"name": "node n", "spanId": "x", "startTimeUnixNano": 0, "endTimeUnixNano": 1}]  # no parent id
    (tmp_path / "many.json").write_text(_otlp(spans))
    requests = read_traces([tmp_path / "many.json"])
    assert len(requests) == 20_000 and all(not r.nodes for r in requests)


def test_a_span_id_that_is_not_a_string_leaves_that_span_out(tmp_path: Path) -> None:
    """A parentSpanId or spanId that is a JSON list or object was an internal error (TypeError: unhashable),
    where any other unreadable field leaves the span out and counts it."""
    node = {"name": "node a", "traceId": "t", "spanId": "c1", "parentSpanId": ["r"], "startTimeUnixNano": 0}
    odd = {**ROOT, "spanId": {"x": 1}}
    ok = {**ROOT, "spanId": "r2"}
    (tmp_path / "t.json").write_text(_otlp([ROOT, node, odd, ok]))
    skipped: list[str] = []
    requests = read_traces([tmp_path / "t.json"], skipped)
    assert [(r.request_id, len(r.nodes)) for r in requests] == [("r", 0), ("r2", 0)]
    assert skipped == [
        "node span 'c1': parentSpanId is a list, not an id",
        "request span {'x': 1}: spanId is a dict, not an id",
    ]
