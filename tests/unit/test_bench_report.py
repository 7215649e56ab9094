"""Report rendering, JSON, ratios (refused for non-equivalent baselines), equivalence, metrics parsing."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from rich.console import Console

from usg.bench.breakdown import BreakdownObserver, breakdown_from_metrics, parse_prometheus
from usg.bench.equivalence import check_equivalence, compare_outputs
from usg.bench.loadgen import LoadResult
from usg.bench.report import (
    MIN_RELIABLE_REQUESTS,
    BenchReport,
    coarse_count_note,
    ratio_rows,
    render_report,
    report_json,
)
from usg.runtime.batcher import BatchEvent
from usg.runtime.observer import NodeEvent


def result(system: str, conc: int, n: int, ms: float) -> LoadResult:
    r = LoadResult(system, "closed", conc, None, 2.0)
    r.latencies_ms = [ms] * n
    return r


def make_report() -> BenchReport:
    rep = BenchReport("graph.yaml", "graph.yaml", "closed", 2.0, 1.0)
    rep.results = [
        result("usg", 16, 40, 100.0),
        result("http-stitched", 16, 20, 200.0),
        result("ray-serve", 16, 30, 150.0),
    ]
    ref = {"lines": [{"text": "a"}], "emb": np.ones(4)}
    rep.equivalence["http-stitched"] = check_equivalence("http-stitched", "usg", [("s", ref, ref)])
    rep.equivalence["ray-serve"] = check_equivalence(
        "ray-serve", "usg", [("s", ref, {**ref, "lines": [{"text": "b"}]})]
    )
    return rep


def test_ratios_and_refusal():
    rows = {r["system"]: r for r in ratio_rows(make_report())}
    assert rows["http-stitched"]["throughput_ratio"] == 2.0
    assert rows["http-stitched"]["p95_ratio"] == 2.0
    assert rows["ray-serve"]["throughput_ratio"] is None
    assert rows["ray-serve"]["refused"] == "outputs differ from USG's"


def test_render_and_json():
    rep = make_report()
    buf = io.StringIO()
    render_report(rep, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "2.00×" in text and "refused: outputs differ" in text
    doc = json.loads(json.dumps(report_json(rep)))
    assert doc["results"][0]["throughput_rps"] == 20.0
    assert doc["equivalence"]["ray-serve"]["ok"] is False


def test_compare_outputs_text_and_cosine():
    a = {"lines": [{"text": "x", "score": 0.9}], "e": np.array([[1.0, 0.0]])}
    assert compare_outputs(a, {"lines": [{"text": "x", "score": 0.8}], "e": [[1.0, 1e-4]]}) == []
    problems = compare_outputs(a, {"lines": [{"text": "y"}], "e": [[0.0, 1.0]]})
    assert any("'lines'" in p for p in problems) and any("cosine 0.000000" in p for p in problems)
    assert compare_outputs(a, {"lines": [{"text": "x"}]}) == ["output 'e' missing (reference has it)"]


def test_breakdown_observer_batched_and_direct():
    obs = BreakdownObserver()
    obs.batch_finished(BatchEvent("rec", 4, 4, 100, 120, (1.0, 2.0, 3.0, 2.0), 30.0, True))
    obs.batch_finished(BatchEvent("rec", 2, 2, 50, 50, (1.0, 1.0), 20.0, True))
    obs.node_finished(NodeEvent("r1", "rec", "model", "rec", 0.0, 1.0, 8.0, 50.0, 6, True))  # ignored: batched
    obs.node_finished(NodeEvent("r1", "det", "model", "det", 0.0, 1.0, 1.0, 40.0, 1, True))
    obs.request_finished("r1", ["image"], 1.0, "ok", [])
    obs.request_finished("r2", ["image"], 1.0, "ok", [])
    rec, det = {m.model: m for m in obs.snapshot()}["rec"], {m.model: m for m in obs.snapshot()}["det"]
    assert rec.items == 6 and rec.calls == 2 and rec.mean_batch == 3.0
    assert rec.queue_ms_mean == 10.0 / 6 and rec.compute_ms_mean == 25.0
    assert abs(rec.padding_waste - 20 / 170) < 1e-9
    assert rec.items_per_request == 3.0
    assert det.calls == 1 and det.compute_ms_mean == 40.0
    obs.reset()
    assert obs.snapshot() == []


METRICS_BEFORE = """# HELP usg_model_items_total x
usg_model_items_total{model="rec"} 10.0
usg_batch_size_bucket{le="1.0",model="rec"} 2.0
usg_batch_size_bucket{le="4.0",model="rec"} 4.0
usg_batch_size_bucket{le="+Inf",model="rec"} 4.0
usg_batch_size_count{model="rec"} 4.0
usg_batch_size_sum{model="rec"} 10.0
usg_model_queue_wait_seconds_sum{model="rec"} 0.01
usg_model_compute_seconds_sum{model="rec"} 0.2
usg_model_compute_seconds_count{model="rec"} 4.0
"""
METRICS_AFTER = """usg_model_items_total{model="rec"} 22.0
usg_batch_size_bucket{le="1.0",model="rec"} 2.0
usg_batch_size_bucket{le="4.0",model="rec"} 7.0
usg_batch_size_bucket{le="+Inf",model="rec"} 7.0
usg_batch_size_count{model="rec"} 7.0
usg_batch_size_sum{model="rec"} 22.0
usg_model_queue_wait_seconds_sum{model="rec"} 0.034
usg_model_compute_seconds_sum{model="rec"} 0.5
usg_model_compute_seconds_count{model="rec"} 7.0
usg_model_items_total{model="det"} 3.0
usg_model_compute_seconds_sum{model="det"} 0.3
usg_model_compute_seconds_count{model="det"} 3.0
usg_batch_cap{model="rec"} 2.0
"""


def test_breakdown_from_metrics_deltas():
    parsed = parse_prometheus(METRICS_AFTER)
    assert parsed[("usg_model_items_total", (("model", "rec"),))] == 22.0
    models = {m.model: m for m in breakdown_from_metrics(METRICS_BEFORE, METRICS_AFTER, requests=4)}
    rec = models["rec"]
    assert rec.items == 12 and rec.calls == 3 and rec.mean_batch == 4.0
    assert dict(rec.batch_sizes) == {4: 3}
    assert abs(rec.queue_ms_mean - 2.0) < 1e-9
    assert abs(rec.compute_ms_mean - 100.0) < 1e-9
    assert rec.items_per_request == 3.0
    det = models["det"]
    assert det.calls == 3 and abs(det.compute_ms_mean - 100.0) < 1e-9
    assert (rec.batch_cap, det.batch_cap) == (2, None)  # the server's usg_batch_cap gauge


def test_breakdown_shows_each_batching_models_cap_and_what_its_controller_did():
    from concurrent.futures import ThreadPoolExecutor

    from usg.graph import BatchPolicy
    from usg.runtime.batcher import BatchingRunner
    from usg.testing import FakeBackend

    pool = ThreadPoolExecutor(1)
    on = BatchingRunner("rec", FakeBackend(lambda i: i), pool, BatchPolicy(max_size=8, adaptive=True))
    off = BatchingRunner("cls", FakeBackend(lambda i: i), pool, BatchPolicy(max_size=4, adaptive=False))
    obs = BreakdownObserver()
    obs.bind_runners({"rec": on, "cls": off})
    obs.reset()
    for _ in range(4):  # one decision window (a fresh controller's are 4 calls): the cap stays, one probe starts
        on.controller.observe(BatchEvent("rec", 8, 8, 0, 0, (0.0,) * 8, 8.0, True))
        obs.batch_finished(BatchEvent("rec", 8, 8, 0, 0, (0.0,) * 8, 8.0, True))
    obs.batch_finished(BatchEvent("cls", 4, 4, 0, 0, (0.0,) * 4, 1.0, True))
    models = {m.model: m for m in obs.snapshot()}
    assert models["rec"].batch_cap == 8 and models["cls"].batch_cap == 4
    assert models["cls"].controller == "off (declared values)"
    assert re.match(r"on: settled cap 8, 0 move\(s\), 1 probe\(s\) in the run", models["rec"].controller)
    assert models["rec"].to_json()["controller"] == models["rec"].controller
    pool.shutdown()


def test_bench_public_api_is_sorted_and_importable():
    import usg.bench

    assert usg.bench.__all__ == sorted(usg.bench.__all__)
    for name in usg.bench.__all__:
        assert getattr(usg.bench, name) is not None


def test_bound_measurements_without_model_rates_are_averaged_per_level():
    from usg.bench.bound import summarize_bounds as _summarize_bounds

    bounds = [
        {"bound_rps": 4.0, "level": 16.0, "achieved": 0.75, "per_model": {}, "bottleneck": "det"},
        {"bound_rps": 2.0, "level": 16.0, "achieved": 0.95, "per_model": {}, "bottleneck": "det"},
        {"bound_rps": 3.0, "level": 1.0, "achieved": 0.5, "per_model": {}, "bottleneck": "det"},
    ]
    s = _summarize_bounds(bounds, [1.0, 16.0])
    assert s["bound_rps"] == 3.0
    assert s["achieved"] == {"1": 0.5, "16": 0.85}
    assert [m["bound_rps"] for m in s["measurements"]] == [4.0, 2.0, 3.0]


def test_the_no_overlap_bound_is_summarised_and_printed_with_what_usg_reached_of_it():
    from usg.bench.bound import summarize_bounds

    def model(rate: float, items: float) -> dict[str, float]:
        return {"items_per_request": items, "machine_items_per_s": rate, "batch": 1, "threads": 1, "instances": 2}

    def measurement(det_rate: float, rec_rate: float, usg: float) -> dict[str, object]:
        per_model = {"det": model(det_rate, 1.0), "rec": model(rec_rate, 3.75)}
        serial = 1.0 / (1.0 / det_rate + 3.75 / rec_rate)
        return {
            "per_model": per_model,
            "bottleneck": "det",
            "basis": "b",
            "bound_rps": det_rate,
            "serial_bound_rps": serial,
            "level": 16.0,
            "usg_rps": usg,
            "achieved": usg / det_rate,
            "achieved_serial": usg / serial,
        }

    # det ran fastest in the first measurement, rec in the second (the other window disturbed)
    bounds = [measurement(4.0, 30.0, 1.8), measurement(3.0, 40.0, 2.2)]
    s = summarize_bounds(bounds, [16.0])
    # per model the fastest rate of the run: det 250 ms + rec 3.75 x 25 ms = 343.75 ms a request
    assert s["serial_bound_rps"] == pytest.approx(1e3 / 343.75) and s["bound_rps"] == pytest.approx(4.0)
    # USG's mean (2.0 req/s) against it; never more than against any single measurement
    assert s["achieved_serial"] == {"16": pytest.approx(2.0 * 0.34375)}
    assert s["achieved"] == {"16": pytest.approx(0.5)}
    singles = [m["serial_bound_rps"] for m in s["measurements"]]
    assert s["serial_bound_rps"] > max(singles) and s["serial_bound_range"] == [min(singles), max(singles)]
    out = io.StringIO()
    render_report(BenchReport("g.yaml", "g.yaml", "closed", 1.0, 0.0, bound=s), Console(file=out, width=300))
    text = out.getvalue()
    assert (
        "no-overlap model-only bound (the models share the cores): 2.91 req/s (single measurements 2.34–2.67)" in text
    )
    assert "USG at 16 clients: 69% of it" in text and "det 1 items x 250 ms (batch 1, 1 thread(s) x 2)" in text
    assert "rec 3.75 items x 25 ms" in text and "fastest of the run's 2 measurement(s)" in text


def test_plots_of_a_run_where_no_request_completed(tmp_path):
    import pytest

    pytest.importorskip("matplotlib", reason="plots need usg[report]")
    from usg.bench.plots import write_plots

    rep = BenchReport("graph.yaml", "graph.yaml", "closed", 2.0, 1.0)
    rep.results = [result("usg", 2, 0, 0.0), result("sequential", 2, 0, 0.0)]  # an overloaded machine
    paths = write_plots(rep, tmp_path)  # no "no artists with labels" warning (an error under pytest)
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_ratios_carry_their_spread_over_rounds_and_warn_on_few_requests():
    rep = BenchReport("graph.yaml", "graph.yaml", "closed", 6.0, 1.0)
    usg, seq = result("usg", 16, 40, 100.0), result("sequential", 16, 9, 200.0)
    usg.extra["round_rps"], seq.extra["round_rps"] = [10.0, 12.0, 8.0], [5.0, 4.0, 8.0]
    rep.results = [usg, seq]
    (row,) = ratio_rows(rep)
    assert row["round_ratios"] == [2.0, 3.0, 1.0]
    assert row["few_requests"] is True  # the baseline completed 9 (< 30) requests
    buf = io.StringIO()
    render_report(rep, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "(1.00–3.00 over 3 rounds)" in text and f"< {MIN_RELIABLE_REQUESTS} requests" in text


def test_a_single_round_with_enough_requests_has_no_spread_or_warning():
    rows = {r["system"]: r for r in ratio_rows(make_report())}
    assert rows["http-stitched"]["round_ratios"] is None
    assert rows["http-stitched"]["few_requests"] is True  # 20 requests
    rep = make_report()
    rep.results[1].latencies_ms *= 2  # 40 requests
    assert {r["system"]: r for r in ratio_rows(rep)}["http-stitched"]["few_requests"] is False


def test_a_count_of_whole_requests_per_client_is_flagged_with_the_closed_loop_rate():
    # session 16's rapidocr run: 16 clients whose requests ran side by side and finished together
    # 25 s after they started, so each 30 s round counted exactly 16 (0.53 req/s, as at 29 s)
    pool = LoadResult("rapidocr", "closed", 16, None, 60.0)
    pool.latencies_ms = [25_000.0] * 32
    note = coarse_count_note(pool, 30.0, "rapidocr@c16")
    assert note is not None
    assert "took 25.0 s (p50) in 30 s rounds" in note and "about 1.2 a round" in note
    assert "0.64 req/s against 0.53 counted" in note  # 16 clients / 25 s
    assert "raise --duration to at least 125 s" in note
    # requests short against the round: many per client, the count is a rate
    quick = LoadResult("usg", "closed", 16, None, 60.0)
    quick.latencies_ms = [2_000.0] * 480
    assert coarse_count_note(quick, 30.0, "usg@c16") is None
    # open loop: no clients to count in
    open_loop = LoadResult("usg", "open", None, 1.0, 60.0)
    open_loop.latencies_ms = [25_000.0] * 32
    assert coarse_count_note(open_loop, 30.0, "usg@1rps") is None
