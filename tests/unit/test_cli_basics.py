"""CLI behaviour on bad input: one clear message, non-zero exit, never a traceback."""

from pathlib import Path

import pytest

from usg.cli import main

GRAPH = """
name: echo
inputs:
  text: {modality: text, optional: true}
  image: {modality: image, optional: true}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}}
  raw: {fn: "testops:raw_image", inputs: {image: inputs.image}}
outputs: {shout: up.text, img: raw.hwc}
"""


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return exc.value.code, out.out, out.err


@pytest.fixture()
def graph(tmp_path: Path) -> Path:
    p = tmp_path / "echo.yaml"
    p.write_text(GRAPH)
    return p


def test_run_json_prints_exactly_one_object(graph, capsys):
    import json

    code, out, _ = run_cli(["run", str(graph), "-i", "text=hello", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["outputs"] == {"shout": "HELLO"}
    assert data["pruned_nodes"] == ["raw"]
    assert set(data["node_ms"]) == {"up"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: ((d / "zero.png").write_bytes(b"") and str(d / "zero.png")) or str(d / "zero.png"),
            "is empty (0 bytes)",
        ),
        (
            lambda d: (d / "bad.png").write_bytes(b"\x89PNGgarbage") and str(d / "bad.png"),
            "not a decodable image",
        ),
    ],
)
def test_run_bad_images(graph, tmp_path, capsys, make, message):
    path = make(tmp_path)
    code, _, err = run_cli(["run", str(graph), "-i", f"image={path}"], capsys)
    assert code == 1
    assert message in err and "fix:" in err


def test_run_missing_image_file_is_a_usage_error(graph, tmp_path, capsys):
    code, _, err = run_cli(["run", str(graph), "-i", f"image={tmp_path / 'missing.png'}"], capsys)
    assert code == 2 and "does not exist" in err and "fix:" in err


def test_run_bad_arguments(graph, capsys):
    code, _, err = run_cli(["run", str(graph), "-i", "nope=1"], capsys)
    assert code == 2 and "has no input 'nope'" in err
    code, _, err = run_cli(["run", str(graph), "-i", "text"], capsys)
    assert code == 2 and "is not NAME=VALUE" in err


def test_run_malformed_graph_and_cycle(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed\n")
    code, _, err = run_cli(["run", str(bad), "-i", "text=x"], capsys)
    assert code == 1 and "malformed YAML" in err
    cyc = tmp_path / "cyc.yaml"
    cyc.write_text(
        GRAPH.replace(
            "inputs: {text: inputs.text}}",
            "inputs: {text: up2.text}}\n  up2: {fn: 'testops:upper', inputs: {text: up.text}}",
        )
    )
    code, _, err = run_cli(["run", str(cyc), "-i", "text=x"], capsys)
    assert code == 1 and "cycle: " in err


def test_graph_show_lists_pruning(graph, capsys):
    code, out, _ = run_cli(["graph", "show", str(graph), "--modalities", "text"], capsys)
    assert code == 0
    assert "runs:   up" in out and "pruned: raw" in out and "outputs present: shout" in out
    code, _, err = run_cli(["graph", "show", str(graph), "--modalities", "audio"], capsys)
    assert code == 2 and "matches no input" in err


def test_graph_show_engine_ray_lists_the_deployments(tmp_path, capsys):
    p = tmp_path / "scaled.yaml"
    p.write_text(
        GRAPH
        + "deploy:\n  router: {num_replicas: 2}\n  nodes:\n"
        + "    raw: {own_deployment: true, min_replicas: 1, max_replicas: 3}\n"
    )
    code, out, _ = run_cli(["graph", "show", str(p), "--engine", "ray"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "node-raw" in text and "1-3 auto" in text
    assert "router" in text and "node up" in text  # the router runs the other Python node itself


def test_doctor_dry_run_says_when_it_passed(graph, tmp_path, capsys):
    code, _, err = run_cli(["doctor", str(graph), "--dry-run"], capsys)
    assert code == 0 and f"dry run passed: {graph}" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text(GRAPH.replace("testops:upper", "testops:boom"))
    code, _, err = run_cli(["doctor", str(broken), "--dry-run"], capsys)
    assert "dry run passed" not in err


def test_run_text_output_escapes_markup(graph, capsys):
    code, out, _ = run_cli(["run", str(graph), "-i", "text=[bold]x[/bold] [batch,seq]"], capsys)
    assert code == 0 and "[BOLD]X[/BOLD] [BATCH,SEQ]" in out
