"""The live monitor inside a served app (TestClient, real executor, python-backend model)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("scipy")
pytest.importorskip("starlette")

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from usg.graph import load_graph
from usg.monitor.addon import serve_addons
from usg.monitor.live import LiveMonitor
from usg.monitor.profile import build_profile, write_profile
from usg.serve import create_app

MONITOR = Path(__file__).resolve().parents[1] / "resources" / "monitor"
sys.path.insert(0, str(MONITOR))
WORDS = ["alpha", "beta", "gamma", "delta", "total", "due", "invoice", "amount", "paid", "date", "order"]


def _texts(n: int, seed: int, times: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join([" ".join(rng.choice(WORDS, size=int(rng.integers(3, 10))))] * times) for _ in range(n)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ref-inputs")
    for i, text in enumerate(_texts(300, 0)):
        (folder / f"t{i:04d}.txt").write_text(text)
    out = folder.parent / "ref.json"
    write_profile(build_profile(load_graph(MONITOR / "graph.yaml"), folder), out)
    return out


def _metric(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"{name} {labels} not in /metrics")


def _serve(reference: Path) -> tuple[TestClient, LiveMonitor]:
    graph = load_graph(MONITOR / "graph.yaml")
    addons = serve_addons(graph, reference=reference)
    monitor = addons[0]
    assert isinstance(monitor, LiveMonitor)
    return TestClient(create_app(graph, addons=addons)), monitor


def _wait_evaluations(monitor: LiveMonitor, n: int) -> dict[str, Any]:
    """The worker thread's n-th evaluation (bounded wait: no timing assertion, just no hang)."""
    deadline = time.monotonic() + 60
    while monitor.evaluations < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert monitor.evaluations == n and monitor.latest is not None
    return monitor.latest


def _send(client: TestClient, texts: list[str]) -> None:
    for t in texts:
        assert client.post("/v1/infer", json={"inputs": {"text": t}}).status_code == 200


def test_no_drift_then_text_length_doubled_flagged_within_one_window(reference: Path) -> None:
    client, monitor = _serve(reference)
    with client:
        _send(client, _texts(60, 1))  # the graph's window: 60 requests, evaluated every 60
        first = _wait_evaluations(monitor, 1)
        assert not first["drift"], first["drifted"]
        _send(client, _texts(60, 2, times=2))
        second = _wait_evaluations(monitor, 2)
        body = client.get("/v1/monitor").json()
        metrics = client.get("/metrics").text
    assert {"text.characters", "text.tokens"} <= set(second["drifted"])
    assert "score" in second["drifted"]  # the score follows text length
    assert body["drift"]["drift"] is True and body["window"]["evaluations"] == 2
    assert body["reference"]["graph"] == "monitored"
    assert _metric(metrics, "usg_drift_detected") == 1.0
    assert _metric(metrics, "usg_drift_feature_drift", input="text", feature="characters") == 1.0
    assert _metric(metrics, "usg_drift_output_kl", output="score") > 0.05


def test_health_components_weights_and_cache_not_applicable(reference: Path) -> None:
    client, _ = _serve(reference)
    with client:
        _send(client, _texts(30, 3))
        assert client.post("/v1/infer", json={"inputs": {"nope": 1}}).status_code == 400
        body = client.get("/v1/monitor").json()
        metrics = client.get("/metrics").text
    health = body["health"]
    comps = {c["name"]: c for c in health["components"]}
    assert set(comps) == {
        "latency_jitter",
        "modality_missing",
        "cache_hit_ratio",
        "error_rate",
        "rejection_rate",
        "queue_saturation",
    }
    assert comps["cache_hit_ratio"]["applicable"] is False and "not applicable" in comps["cache_hit_ratio"]["detail"]
    assert comps["cache_hit_ratio"]["effective_weight"] == 0.0
    applicable = [c for c in comps.values() if c["applicable"]]
    assert sum(c["effective_weight"] for c in applicable) == pytest.approx(1.0)
    assert comps["error_rate"]["value"] == 0.0 and comps["modality_missing"]["value"] == 0.0
    assert 0 < health["score"] <= 100
    assert _metric(metrics, "usg_health_score") == pytest.approx(health["score"], abs=5)
    assert math.isnan(_metric(metrics, "usg_health_component_score", component="cache_hit_ratio"))
    assert _metric(metrics, "usg_health_component_weight", component="error_rate") > 0


def test_health_score_falls_with_errors_and_rejections() -> None:
    from usg.monitor.config import DEFAULT_WEIGHTS
    from usg.monitor.health import RequestRecord, health_score

    ok = [RequestRecord(float(i), 0.01, "ok", ("text",)) for i in range(50)]
    bad = [RequestRecord(float(i), 0.01, "error" if i % 5 == 0 else "ok", ("text",)) for i in range(50)]
    kwargs: dict[str, Any] = {
        "weights": DEFAULT_WEIGHTS,
        "declared_modalities": ["text"],
        "reference_presence": {"text": 1.0},
        "saturation": [0.1],
    }
    good = health_score(ok, rejected=0, **kwargs)
    worse = health_score(bad, rejected=10, **kwargs)
    assert good["score"] > 95 > worse["score"]
    errs = {c["name"]: c for c in worse["components"]}
    assert errs["error_rate"]["value"] == pytest.approx(0.2) and errs["error_rate"]["score"] == 0.0
    assert errs["rejection_rate"]["value"] == pytest.approx(10 / 60, abs=1e-5)


def test_window_endpoint_is_a_profile_usg_drift_reads(reference: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from usg.cli import cli

    client, monitor = _serve(reference)
    with client:
        _send(client, _texts(40, 4, times=2))
        monitor.process_pending()
        window = client.get("/v1/monitor/window")
    assert window.status_code == 200
    (tmp_path / "window.json").write_text(window.text)
    res = CliRunner().invoke(cli, ["drift", str(reference), str(tmp_path / "window.json")], standalone_mode=False)
    assert isinstance(res.exception, SystemExit) and res.exception.code == 1, res.output
    assert "text.characters" in res.output


def test_monitor_section_errors_name_the_field() -> None:
    from usg.errors import GraphError
    from usg.monitor.config import parse_monitor

    graph = load_graph(MONITOR / "graph.yaml")
    with pytest.raises(GraphError, match=r"monitor\.outputs\.nope: 'nope' is neither a graph output"):
        parse_monitor({"outputs": {"nope": {"kind": "embedding"}}}, graph)
    with pytest.raises(GraphError, match=r"monitor\.window\.size: size is 5"):
        parse_monitor({"window": {"size": 5}}, graph)
    with pytest.raises(GraphError, match=r"monitor\.outputs\.score\.kind: kind is 'histogram'"):
        parse_monitor({"outputs": {"score": {"kind": "histogram"}}}, graph)
    with pytest.raises(GraphError, match=r"monitor\.thresholds\.alpha: unknown key"):
        parse_monitor({"thresholds": {"alpha": 0.1}}, graph)
    cfg = parse_monitor({"window": {"seconds": 30, "step": 10}}, graph)
    assert cfg.window.seconds == 30 and cfg.window.every == 10


def test_time_window_keeps_only_the_last_seconds(reference: Path) -> None:
    from usg.monitor.config import MonitorConfig, WindowSpec, monitor_config
    from usg.monitor.profile import load_profile

    graph = load_graph(MONITOR / "graph.yaml")
    now = [1000.0]
    base = monitor_config(graph)
    config = MonitorConfig(window=WindowSpec(size=None, seconds=30.0), outputs=base.outputs)
    monitor = LiveMonitor(graph, load_profile(reference), config, clock=lambda: now[0])
    for i, text in enumerate(_texts(40, 5, times=2) + _texts(40, 6)):
        now[0] = 1000.0 + i  # one request a second: the doubled texts are older than 30 s at the end
        monitor.request_values(f"r{i}", {"text": text}, {})
        monitor.request_finished(f"r{i}", ["text"], 0.01, "ok", [])
        monitor.process_pending()
    assert monitor.evaluations == 0  # time windows are evaluated by the worker every `step` seconds
    result = monitor.evaluate()
    assert result["window_count"] == 31 and not result["drift"], result["drifted"]
    assert monitor.health()["requests"] == 31


def test_a_monitor_behind_drops_and_counts_instead_of_queueing(reference: Path) -> None:
    from usg.monitor.profile import load_profile

    monitor = LiveMonitor(load_graph(MONITOR / "graph.yaml"), load_profile(reference))
    big = np.zeros((4000, 4000, 3), dtype=np.uint8)  # 48 MB decoded: the byte budget binds first
    for i in range(300):
        monitor.request_values(f"r{i}", {"text": "hello", "image": big}, {})
    assert monitor.dropped == 300 - 5
    assert monitor.process_pending() == 5 and monitor.pending_bytes == 0


def test_health_cache_hit_ratio_counts_node_cache_lookups_in_the_window(reference: Path) -> None:
    from usg.monitor.profile import load_profile
    from usg.records import CacheEvent

    graph = load_graph(MONITOR / "graph.yaml")
    now = [1000.0]
    monitor = LiveMonitor(graph, load_profile(reference), clock=lambda: now[0])
    for i, text in enumerate(_texts(20, 3)):
        now[0] = 1000.0 + i
        monitor.request_values(f"r{i}", {"text": text}, {})
        monitor.request_finished(f"r{i}", ["text"], 0.01, "ok", [])
        outcome = "hit" if i % 4 else "miss"  # 15 of 20 lookups hit
        monitor.cache_event(CacheEvent("embed", "memory", outcome, 0.0001))
        monitor.cache_event(CacheEvent("embed", "memory", "store", 0.0001))  # a store is not a lookup
        monitor.process_pending()
    comps = {c["name"]: c for c in monitor.health()["components"]}
    assert comps["cache_hit_ratio"]["applicable"] is True
    assert comps["cache_hit_ratio"]["value"] == pytest.approx(15 / 20)
    assert comps["cache_hit_ratio"]["effective_weight"] > 0
