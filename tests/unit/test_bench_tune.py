"""Tune selection on synthetic profiles, the sidecar round trip, and the model-only bound."""

from __future__ import annotations

import dataclasses

import pytest

from usg.bench.bound import model_only_bound
from usg.bench.tune import ModelChoice, ProfilePoint, choose, write_sidecar
from usg.errors import GraphError
from usg.graph.model import BatchPolicy, Graph, ModelDef
from usg.graph.sidecar import apply_sidecar, sidecar_path


def curve(model: str, threads: int, ms_by_batch: dict[int, float]) -> list[ProfilePoint]:
    return [ProfilePoint(model, b, threads, ms, ms * 1.1, b / (ms / 1e3)) for b, ms in ms_by_batch.items()]


# conv-heavy det: batching barely helps; rec: per-item cost falls until ~8, then flattens
DET = curve("det", 1, {1: 100, 2: 195, 4: 400, 8: 820}) + curve("det", 2, {1: 60, 2: 118, 4: 240, 8: 500})
REC = curve("rec", 1, {1: 20, 2: 24, 4: 32, 6: 40, 8: 47, 12: 70, 16: 94}) + curve(
    "rec", 2, {1: 14, 2: 18, 4: 25, 6: 31, 8: 37, 12: 56, 16: 75}
)


def test_det_prefers_small_batch_and_rec_about_eight():
    det = choose(DET, p95_ms=200, cpus=2)
    assert det.batch in (1, 2) and (det.threads, det.instances) == (1, 2)
    rec = choose(REC, p95_ms=100, cpus=2)
    assert 6 <= rec.batch <= 8 and rec.threads == 1
    # on one core a second thread buys nothing and rec still wants ~8
    assert 6 <= choose(REC, p95_ms=100, cpus=1).batch <= 8


def test_latency_bound_excludes_big_batches():
    rec = choose(REC, p95_ms=30, cpus=2)
    assert rec.point is not None and rec.point.p95_ms <= 30
    assert rec.batch <= 4


def test_no_config_meets_bound_takes_best_throughput_near_the_lowest_latency():
    # det's p95 is 66 ms at best (2 threads × 1): 1 thread × 2 instances is 110 ms but serves 20
    # items/s against 16.7, so it is the better pick for a server once 10 ms is out of reach
    c = choose(DET, p95_ms=10, cpus=2)
    assert (c.batch, c.threads, c.instances) == (1, 1, 2)
    assert "no config meets p95 ≤ 10 ms" in c.reason and "66.0 ms" in c.reason
    assert "raise --p95-ms" in c.reason


def test_fallback_does_not_take_a_config_far_slower_than_the_lowest_latency():
    # 4 threads × batch 8 serves the most items but at 5× the lowest p95: out of the relaxed bound
    points = curve("m", 1, {1: 100}) + curve("m", 4, {8: 500})
    c = choose(points, p95_ms=10, cpus=4)
    assert (c.batch, c.threads, c.instances) == (1, 1, 4)


def test_choose_needs_points():
    with pytest.raises(ValueError, match="no profile points"):
        choose([], 10)


def graph(tmp_path) -> Graph:
    src = tmp_path / "g.yaml"
    src.write_text("name: g\n")
    models = {
        "det": ModelDef("det", "onnxruntime", options={"intra_op_threads": 2}),
        "rec": ModelDef("rec", "onnxruntime", batch=BatchPolicy(max_size=8, max_delay_ms=3)),
    }
    return Graph("g", {}, models, {}, {}, source=src)


def test_sidecar_round_trip(tmp_path):
    g = graph(tmp_path)
    choices = {"det": ModelChoice("det", 2, 1, None, "r", 2), "rec": ModelChoice("rec", 6, 2, None, "r")}
    path = sidecar_path(g.source)
    assert path.name == "g.tuned.yaml"
    write_sidecar(g, choices, {"rec": REC}, {"det": 1.0, "rec": 3.5}, 100.0, path)
    tuned = apply_sidecar(g)
    assert tuned is not g and g.models["det"].batch.max_size == 1  # input unchanged
    assert tuned.models["det"].batch == BatchPolicy(max_size=2, max_delay_ms=2.0, preferred_sizes=(2,))
    assert tuned.models["det"].options == {"intra_op_threads": 1, "concurrency": 2}
    assert tuned.models["rec"].batch.max_size == 6 and tuned.models["rec"].batch.max_delay_ms == 3
    assert tuned.models["rec"].options["intra_op_threads"] == 2


def test_sidecar_naming_an_unknown_model_is_a_graph_error(tmp_path):
    g = graph(tmp_path)
    write_sidecar(g, {"det": ModelChoice("det", 1, 1, None, "r")}, {}, {}, 100.0, sidecar_path(g.source))
    g2 = dataclasses.replace(g, models={"rec": g.models["rec"]})
    with pytest.raises(GraphError, match="the graph has no model 'det'"):
        apply_sidecar(g2)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        # before: yaml's ParserError / UnicodeDecodeError as "internal error" on every usg run/serve
        (b"usg_tune: [unclosed\n", r"g\.tuned\.yaml:2:1: cannot read this usg tune sidecar: expected ',' or ']'"),
        (b"usg_tune: \xff\n", r"g\.tuned\.yaml: cannot read this usg tune sidecar: 'utf-8' codec"),
    ],
)
def test_a_broken_sidecar_is_a_graph_error_with_the_fix(tmp_path, content, match):
    g = graph(tmp_path)
    sidecar_path(g.source).write_bytes(content)
    with pytest.raises(GraphError, match=match) as exc:
        apply_sidecar(g)
    assert "fix: delete it and run `usg tune GRAPH` again" in str(exc.value)


def test_no_sidecar_returns_the_graph(tmp_path):
    g = graph(tmp_path)
    assert apply_sidecar(g) is g


def test_model_only_bound_sums_cpu_cost_over_shared_cores():
    profiles = {"det": DET, "rec": REC}
    b = model_only_bound(profiles, {"det": 1.0, "rec": 4.0}, p95_ms=1000, cores=2)
    # det cheapest: 1 thread, batch 2 → 97.5 CPU ms/item; rec: 1 thread, batch 12 → 5.83 ms/item
    assert b["per_model"]["det"]["core_ms_per_item"] == pytest.approx(97.5)
    assert b["per_model"]["rec"]["core_ms_per_item"] == pytest.approx(70 / 12)
    assert b["bound_rps"] == pytest.approx(2000 / (97.5 + 4 * 70 / 12))
    assert b["bottleneck"] == "det"


def test_bound_sidecar_elsewhere_measures_with_tuned_settings_and_leaves_the_graph_as_written(tmp_path):
    from usg.cli.bench_cmd import _bound_meter

    g = graph(tmp_path)  # no sidecar next to it: the graph as written
    elsewhere = tmp_path / "copy" / "g.tuned.yaml"
    elsewhere.parent.mkdir()
    write_sidecar(g, {"rec": ModelChoice("rec", 2, 1, None, "r", 2)}, {"rec": REC}, {"rec": 3.5}, 100.0, elsewhere)
    notes: list[str] = []
    assert _bound_meter(g, [], notes) is None and "--bound-sidecar" in notes[0]
    meter = _bound_meter(g, [], [], elsewhere, untuned=True)
    assert meter.graph.models["rec"].batch.max_size == 2 and meter.graph.models["rec"].options["concurrency"] == 2
    assert g.models["rec"].batch.max_size == 8 and "concurrency" not in g.models["rec"].options
    assert _bound_meter(g, [], [], None, untuned=True) is None


def test_bound_sidecar_without_a_graph_is_a_usage_error(tmp_path):
    from usg.cli.bench_cmd import _bound_meter
    from usg.errors import UsageError

    with pytest.raises(UsageError, match="--graph GRAPH"):
        _bound_meter(None, [], [], tmp_path / "g.tuned.yaml")
