"""`usg bench` and `usg tune` on the real document-OCR graph: short, bounded runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from usg.cli import cli

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"

pytestmark = pytest.mark.slow


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.timeout(120)
def test_bench_in_process_against_sequential(tmp_path):
    doc = invoke(
        "bench",
        str(GRAPH),
        # 8 s: a loaded machine finished no sequential request in a 3 s window (the ratio needs one)
        "--duration",
        "8",
        "--warmup",
        "1",
        "--concurrency",
        "2",
        "--compare",
        "sequential",
        "--untuned",
        "--json",
        "--plot",
        str(tmp_path),
    )
    systems = [r["system"] for r in doc["results"]]
    assert systems == ["usg", "sequential"]
    usg = doc["results"][0]
    assert usg["completed"] > 0 and usg["errors"] == 0
    assert usg["p50_ms"] <= usg["p95_ms"] <= usg["p99_ms"]
    assert doc["equivalence"]["sequential"]["ok"] is True
    (ratio,) = doc["ratios"]
    assert ratio["system"] == "sequential" and ratio["throughput_ratio"] > 0
    breakdown = {m["model"]: m for m in doc["breakdown"]["usg@c2"]}
    assert {"det", "cls", "rec", "minilm"} <= set(breakdown)
    assert breakdown["det"]["items_per_request"] == pytest.approx(1.0, abs=0.5)
    assert (tmp_path / "latency_cdf.png").stat().st_size > 0
    assert (tmp_path / "throughput.png").stat().st_size > 0


@pytest.mark.timeout(120)
def test_bench_url_target_reads_server_metrics(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "resources" / "serve"))
    from harness import start_server

    server = start_server(GRAPH, "--no-cache", tmp=tmp_path)  # else repeated samples are cache hits: no rec call
    try:
        # long enough that document requests finish on a loaded 2-core machine (the first ones warm up)
        doc = invoke("bench", server.url, "--duration", "10", "--warmup", "2", "--concurrency", "2", "--json")
    finally:
        server.stop()
    (run,) = doc["results"]
    assert run["completed"] > 0 and run["errors"] == 0, run
    models = {m["model"]: m for m in doc["breakdown"]["usg@c2"]}
    assert models["rec"]["items"] > 0 and models["rec"]["calls"] > 0


@pytest.mark.timeout(120)
def test_tune_profiles_and_writes_sidecar(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(GRAPH.read_text().replace("${USG_CACHE}", "${USG_CACHE:-~/.cache/usg}"))
    doc = invoke(
        "tune",
        str(graph),
        "--models",
        "minilm,cls",
        "--batch-sizes",
        "1,4",
        "--threads",
        "1",
        "--seconds",
        "0.05",
        "--json",
    )
    assert set(doc["choices"]) == {"minilm", "cls"}
    assert {p["batch"] for p in doc["profiles"]["cls"]} == {1, 4}
    assert doc["items_per_request"]["det"] == 1.0
    sidecar = tmp_path / "graph.tuned.yaml"
    assert doc["sidecar"] == str(sidecar)
    from usg.graph import load_graph
    from usg.graph.sidecar import apply_sidecar

    tuned = apply_sidecar(load_graph(graph))
    assert tuned.models["cls"].batch.max_size == doc["choices"]["cls"]["batch"]
    assert tuned.models["minilm"].options["intra_op_threads"] == 1


@pytest.mark.timeout(240)
def test_bench_measures_the_bound_from_a_sidecar_kept_elsewhere(tmp_path):
    # `usg tune` on a copy; `usg bench` runs the graph as written and takes only the bound from the copy
    copy = tmp_path / "graph.yaml"
    copy.write_text(GRAPH.read_text().replace("${USG_CACHE}", "${USG_CACHE:-~/.cache/usg}"))
    tune = ("--models", "cls", "--batch-sizes", "1,2", "--threads", "1", "--seconds", "0.05", "--json")
    invoke("tune", str(copy), *tune)
    sidecar = tmp_path / "graph.tuned.yaml"
    doc = invoke(
        "bench",
        str(GRAPH),
        "--duration",
        "3",
        "--warmup",
        "1",
        "--concurrency",
        "2",
        "--bound-sidecar",
        str(sidecar),
        "--json",
    )
    bound = doc["bound"]
    assert set(bound["per_model"]) == {"cls"}  # the models the sidecar tuned
    cls = bound["per_model"]["cls"]
    assert cls["machine_items_per_s"] > 0 and (cls["threads"], cls["instances"]) in {(1, 1), (1, 2), (2, 1)}
    assert bound["serial_bound_rps"] > 0 and bound["achieved_serial"]["2"] > 0
    # the graph under test is the one as written: the controller runs rec from its declared cap
    assert doc["graph"] == str(GRAPH)
