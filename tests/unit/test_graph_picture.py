"""``usg graph show --format mermaid|dot|svg|png``: nodes, models, batch policies, fan-out, gating colours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from usg.cli import main
from usg.cli.graph_picture import gating_modalities, to_dot, to_mermaid
from usg.graph import load_graph

GRAPH = """
name: fan
inputs:
  text: {modality: text, optional: true}
  x: {modality: tensor, dtype: float32, shape: [1, null], optional: true}
models:
  scale: {backend: python, options: {callable: "testops:identity"}, batch: {max_size: 4, max_delay_ms: 2}}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}}
  split: {fn: "testops:split_rows", inputs: {x: inputs.x}}
  each: {model: scale, map: true, inputs: {x: split.items}}
outputs: {shout: up.text, parts: each.y}
"""


@pytest.fixture()
def graph(tmp_path: Path):
    p = tmp_path / "fan.yaml"
    p.write_text(GRAPH)
    return p


def test_gating_follows_the_inputs_a_node_needs(graph):
    g = load_graph(graph)
    gates = gating_modalities(g)
    assert gates["up"] == {"text"} and gates["split"] == {"tensor"} and gates["each"] == {"tensor"}


def test_mermaid_and_dot_show_models_batching_and_fan_out(graph):
    g = load_graph(graph)
    mermaid = to_mermaid(g)
    assert mermaid.startswith("flowchart TD")
    assert 'n_each[["each<br/>model scale (python)<br/>batch ≤4, 2 ms<br/>map over x"]]' in mermaid
    assert 'n_split ==>|"items → x (each item)"| n_each' in mermaid
    assert "class n_up text" in mermaid and "class n_each tensor" in mermaid
    dot = to_dot(g)
    assert 'n_each [label="each\\nmodel scale (python)\\nbatch ≤4, 2 ms\\nmap over x"' in dot
    assert "peripheries=2" in dot and "style=bold" in dot and "cluster_legend" in dot
    assert to_dot(g) == dot  # deterministic: a committed picture can be checked


def test_cli_writes_text_forms_to_stdout_and_files(graph, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["graph", "show", str(graph), "--format", "mermaid"])
        raise SystemExit(0)
    assert exc.value.code == 0 and capsys.readouterr().out == to_mermaid(load_graph(graph))
    out = tmp_path / "g.dot"
    with pytest.raises(SystemExit) as exc:
        main(["graph", "show", str(graph), "--format", "dot", "-o", str(out)])
        raise SystemExit(0)
    assert exc.value.code == 0 and out.read_text() == to_dot(load_graph(graph))


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot (apt-get install graphviz)")
def test_svg_and_png_through_graphviz(graph, tmp_path, capsys):
    for fmt, magic in (("svg", b"<?xml"), ("png", b"\x89PNG")):
        out = tmp_path / f"g.{fmt}"
        with pytest.raises(SystemExit) as exc:
            main(["graph", "show", str(graph), "--format", fmt, "-o", str(out)])
            raise SystemExit(0)
        assert exc.value.code == 0 and out.read_bytes().startswith(magic)


def test_symbolic_shapes_survive_the_terminal_output(tmp_path, capsys):
    p = tmp_path / "sym.yaml"
    p.write_text(GRAPH.replace("shape: [1, null]", "shape: [batch, seq]"))
    with pytest.raises(SystemExit):
        main(["graph", "show", str(p)])
        raise SystemExit(0)
    assert "[batch,seq]" in capsys.readouterr().out.replace(" ", "")
