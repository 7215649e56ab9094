"""The ``align:`` node kind in graph files: schema problems, timestamped inputs, pruning, dump, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from usg.errors import GraphError, InputError, PayloadTooLarge
from usg.graph import load_graph
from usg.graph.dump import graph_to_mapping
from usg.runtime import Executor
from usg.serve.align_metrics import AlignMetrics

GRAPH = """
name: pairs
inputs:
  marks: {modality: text, timestamped: true, optional: true}
  frames: {modality: text, timestamped: true, optional: true, max_items: 4}
nodes:
  pair:
    align:
      streams: {mark: inputs.marks, frame: inputs.frames}
      tolerance_ms: 300
      max_wait_ms: 500
      on_missing: partial
outputs: {tuples: pair.tuples, report: pair.report, marks: inputs.marks}
"""


def _graph(tmp_path: Path, text: str = GRAPH) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


def test_an_align_node_pairs_timestamped_inputs_and_reports_what_is_missing(tmp_path: Path) -> None:
    graph = load_graph(_graph(tmp_path))
    assert graph.nodes["pair"].kind == "align"
    registry = CollectorRegistry()
    metrics = AlignMetrics(registry, graph)
    with Executor(graph, observers=[metrics]) as ex:
        out = ex.infer_sync(
            {
                "marks": [{"text": "one", "ts_ms": 1000}, {"text": "two", "ts_ms": 5000}],
                "frames": [{"text": "slide A", "ts_ms": 1100}, {"value": "slide B", "ts_ms": 9000}],
            }
        ).outputs
    rows = [(t["mark"], t["frame"], t["missing"]) for t in out["tuples"]]
    assert rows == [
        ({"text": "one", "ts_ms": 1000.0}, {"text": "slide A", "ts_ms": 1100.0}, []),
        ({"text": "two", "ts_ms": 5000.0}, None, ["frame"]),
        (None, {"text": "slide B", "ts_ms": 9000.0}, ["mark"]),
    ]
    assert out["tuples"][0]["skew_ms"] == 100.0
    assert out["report"]["missing"] == {"mark": 1, "frame": 1} and out["report"]["tuples"] == 3
    text = generate_latest(registry).decode()
    assert 'usg_align_tuples_total{node="pair"} 3.0' in text
    assert 'usg_align_missing_total{node="pair",stream="frame"} 1.0' in text
    assert 'usg_align_skew_seconds_bucket{le="0.1",node="pair"} 1.0' in text


def test_a_request_without_one_stream_prunes_the_align_node(tmp_path: Path) -> None:
    with Executor(load_graph(_graph(tmp_path))) as ex:
        result = ex.infer_sync({"marks": [{"text": "one", "ts_ms": 0}]})
    assert result.pruned_nodes == ["pair"] and set(result.outputs) == {"marks"}


def test_bad_timestamped_items_and_too_many_items_are_input_errors(tmp_path: Path) -> None:
    with Executor(load_graph(_graph(tmp_path))) as ex:
        with pytest.raises(InputError, match=r"frames\[1\]: item is not \{'text': \.\.\., 'ts_ms': NUMBER\}"):
            ex.infer_sync({"frames": [{"text": "a", "ts_ms": 0}, {"text": "b"}]})
        with pytest.raises(InputError, match=r"frames: expected a list of timestamped items, got str"):
            ex.infer_sync({"frames": "slide"})
        with pytest.raises(PayloadTooLarge, match=r"input 'frames' has 5 items, above its limit of 4 \(max_items\)"):
            ex.infer_sync({"frames": [{"text": "a", "ts_ms": i} for i in range(5)]})


def test_align_schema_problems_are_collected_with_their_fix(tmp_path: Path) -> None:
    bad = GRAPH.replace("on_missing: partial", "on_missing: maybe\n      colour: red")
    bad = bad.replace("frame: inputs.frames}", "missing: inputs.frames}").replace(
        "tolerance_ms: 300", "tolerance_ms: -1"
    )
    with pytest.raises(GraphError) as info:
        load_graph(_graph(tmp_path, bad))
    text = str(info.value)
    assert "nodes.pair.align.on_missing: on_missing is 'maybe'" in text and "use partial or drop" in text
    assert "nodes.pair.align.tolerance_ms: tolerance_ms is -1" in text
    assert "nodes.pair.align.colour: unknown key 'colour'" in text
    assert "nodes.pair.align.streams.missing: stream name 'missing' is reserved" in text


def test_an_align_node_dumps_back_to_the_same_yaml(tmp_path: Path) -> None:
    graph = load_graph(_graph(tmp_path))
    doc = graph_to_mapping(graph)
    assert doc["nodes"]["pair"] == {
        "align": {
            "streams": {"mark": "inputs.marks", "frame": "inputs.frames"},
            "tolerance_ms": 300.0,
            "max_wait_ms": 500.0,
            "on_missing": "partial",
        }
    }
    assert doc["inputs"]["frames"]["timestamped"] is True and doc["inputs"]["frames"]["max_items"] == 4
    again = load_graph(_graph(tmp_path / "..", yaml.safe_dump(doc, sort_keys=False)))
    assert again.nodes["pair"] == graph.nodes["pair"]


def test_v1_json_takes_timestamped_items_and_metrics_show_the_align_node(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from usg.serve import create_app

    body = {
        "inputs": {
            "marks": [{"text": "one", "ts_ms": 0}],
            "frames": [{"text": "slide", "ts_ms": 250}, {"value": "late slide", "ts_ms": 4000}],
        }
    }
    with TestClient(create_app(load_graph(_graph(tmp_path)))) as c:
        r = c.post("/v1/infer", json=body)
        assert r.status_code == 200, r.text
        tuples = r.json()["outputs"]["tuples"]
        assert [(t["mark"] and t["mark"]["text"], t["frame"]["text"]) for t in tuples] == [
            ("one", "slide"),
            (None, "late slide"),
        ]
        bad = c.post("/v1/infer", json={"inputs": {"frames": [{"text": "x", "ts_ms": "soon"}]}})
        assert bad.status_code == 400 and bad.json()["field"] == "frames"
        metrics = c.get("/metrics").text
    assert 'usg_align_missing_total{node="pair",stream="mark"} 1.0' in metrics


def test_usg_run_reads_timestamped_files_as_path_at_ms(tmp_path: Path) -> None:
    from usg.cli.run_cmd import parse_inputs
    from usg.errors import UsageError

    graph = load_graph(_graph(tmp_path))
    (tmp_path / "a.txt").write_text("slide A")
    (tmp_path / "b.txt").write_text("slide B")
    got = parse_inputs(graph, (f"frames={tmp_path / 'a.txt'}@0,{tmp_path / 'b.txt'}@1500.5",))
    assert got == {"frames": [{"text": "slide A", "ts_ms": 0.0}, {"text": "slide B", "ts_ms": 1500.5}]}
    with pytest.raises(UsageError, match=r"'.*a.txt' is not PATH@MS; fix: write --input frames=slide1.png@0"):
        parse_inputs(graph, (f"frames={tmp_path / 'a.txt'}",))
    with pytest.raises(UsageError, match=r"file '.*nope.txt' does not exist"):
        parse_inputs(graph, (f"frames={tmp_path / 'nope.txt'}@0",))


def test_the_python_builder_makes_the_same_align_node(tmp_path: Path) -> None:
    from usg.graph import GraphBuilder

    g = (
        GraphBuilder("pairs")
        .input("marks", "text", optional=True, timestamped=True)
        .input("frames", "text", optional=True, timestamped=True, max_items=4)
        .align("pair", streams={"mark": "inputs.marks", "frame": "inputs.frames"}, tolerance_ms=300, max_wait_ms=500)
        .output("tuples", "pair.tuples")
        .build()
    )
    assert g.nodes["pair"] == load_graph(_graph(tmp_path)).nodes["pair"]
    assert g.inputs["frames"] == load_graph(_graph(tmp_path)).inputs["frames"]
    assert g.nodes["pair"].align is not None
    assert g.nodes["pair"].align.describe() == "align mark, frame ±300 ms (wait 500 ms, partial)"
