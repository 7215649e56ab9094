"""A real ``usg serve --reference REF --trace-file PATH`` process: /v1/monitor, the gauges, and an SLO
report from its own spans that names the injected slow node."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from usg.graph import load_graph
from usg.monitor.profile import build_profile, write_profile

ROOT = Path(__file__).resolve().parents[2]
MONITOR = ROOT / "tests" / "resources" / "monitor"
GRAPH = MONITOR / "graph.yaml"
sys.path.insert(0, str(MONITOR))


def _post(url: str, text: str) -> int:
    body = json.dumps({"inputs": {"text": text}}).encode()
    req = urllib.request.Request(f"{url}/v1/infer", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return int(r.status)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@pytest.mark.slow
def test_served_monitor_and_slo_report_from_the_trace_file(tmp_path: Path) -> None:
    from harness import start_server  # tests/e2e/conftest.py puts the serve harness on sys.path

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "texts.jsonl").write_text(
        "\n".join(json.dumps({"text": f"total due {i} amount paid"}) for i in range(200))
    )
    ref = tmp_path / "ref.json"
    write_profile(build_profile(load_graph(GRAPH), inputs), ref)
    trace = tmp_path / "trace.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MONITOR), os.environ.get("PYTHONPATH", "")])}
    server = start_server(GRAPH, "--reference", str(ref), "--trace-file", str(trace), tmp=tmp_path, env=env)
    try:
        _exercise(server, ref)
        _report(trace, tmp_path, f"{server.url}/metrics")  # the writer flushes each line when idle
    finally:
        code = server.stop()
    assert code == 0, server.output()


def _exercise(server: Any, ref: Path) -> None:
    texts = [f"sleep:0.9 slow request {i}" if i % 6 == 0 else f"total due {i} amount paid" for i in range(60)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert set(pool.map(lambda t: _post(server.url, t), texts)) == {200}
    deadline = time.monotonic() + 60  # the worker evaluates the 60-request window in the background
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = json.loads(_get(f"{server.url}/v1/monitor"))
        if body["window"]["evaluations"] >= 1:
            break
        time.sleep(0.2)
    assert body["window"]["evaluations"] == 1 and body["window"]["observed_total"] == 60
    assert body["drift"]["window_count"] == 60
    assert body["reference"]["graph_sha256"] == json.loads(ref.read_text())["graph"]["sha256"]
    comps = {c["name"]: c for c in body["health"]["components"]}
    assert comps["cache_hit_ratio"]["applicable"] is False and comps["error_rate"]["value"] == 0.0
    assert 0 < body["health"]["score"] <= 100
    metrics = _get(f"{server.url}/metrics")
    assert "usg_health_score " in metrics and 'usg_health_component_weight{component="error_rate"}' in metrics
    assert 'usg_drift_feature_psi{feature="characters",input="text"}' in metrics


def _report(trace: Path, tmp_path: Path, metrics_url: str) -> None:
    assert len(trace.read_text().splitlines()) == 60
    out, js = tmp_path / "report.pdf", tmp_path / "report.json"
    usg = Path(sys.executable).parent / "usg"
    cmd = [
        str(usg),
        "report",
        "slo",
        str(trace),
        "--slo",
        "p95<800ms",
        "-o",
        str(out),
        "--json-out",
        str(js),
        "--metrics",
        metrics_url,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(js.read_text())
    assert data["violating"] == 10 and not data["met"]
    assert data["budget"]["per_node"]["slow"] >= 0.9
    assert out.read_bytes().startswith(b"%PDF")
    assert 0 < data["metrics"]["usg_health_score"] <= 100
