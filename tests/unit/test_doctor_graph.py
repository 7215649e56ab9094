"""Graph checks: build problems become findings by kind; --dry-run catches run-time contract breaks."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from usg.doctor import Stage, run_doctor
from usg.doctor.findings import Finding

pytest.importorskip("usg.graph")


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "relu.onnx"))
    return tmp_path / "relu.onnx"


GOOD = """name: tiny
inputs:
  feats: {modality: tensor, dtype: float32, shape: [N, 3]}
models:
  relu: {backend: onnxruntime, path: relu.onnx}
nodes:
  act: {model: relu, inputs: {x: inputs.feats}}
outputs: {out: act.y}
"""


def graph(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "graph.yaml"
    p.write_text(text)
    return p


def codes(fs: list[Finding]) -> list[str]:
    return sorted(f.code for f in fs)


def test_valid_graph_has_no_findings(tmp_path: Path, model_file: Path) -> None:
    assert run_doctor([graph(tmp_path, GOOD)]).findings == []


@pytest.mark.parametrize(
    ("old", "new", "code", "where", "line_with"),
    [
        ("inputs: {x: inputs.feats}", "inputs: {x: nothere.y}", "GRAPH003", "nodes.act.inputs.x", "act:"),
        ("path: relu.onnx", "path: missing.onnx", "GRAPH007", "models.relu.path", "relu:"),
        ("dtype: float32", "dtype: uint8", "GRAPH005", "nodes.act.inputs.x", "act:"),
        ("shape: [N, 3]", "shape: [N, 3, 4]", "GRAPH006", "nodes.act.inputs.x", "act:"),
        (
            "backend: onnxruntime",
            "backend: onnxruntime, colour: blue",
            "GRAPH002",
            "models.relu.colour",
            "colour",
        ),
    ],
)
def test_build_problem_kinds(
    tmp_path: Path, model_file: Path, old: str, new: str, code: str, where: str, line_with: str
) -> None:
    text = GOOD.replace(old, new)
    fs = run_doctor([graph(tmp_path, text)]).findings
    hit = [f for f in fs if f.evidence.get("where") == where]
    assert [f.code for f in hit] == [code], [(f.code, f.evidence, f.message) for f in fs]
    # located on the YAML line of the where-path
    assert hit[0].location.line == next(i for i, line in enumerate(text.splitlines(), 1) if line_with in line)
    assert hit[0].location.element == where
    assert hit[0].fix


def test_cycle(tmp_path: Path, model_file: Path) -> None:
    text = GOOD.replace(
        "act: {model: relu, inputs: {x: inputs.feats}}",
        "act: {model: relu, inputs: {x: act2.y}}\n  act2: {model: relu, inputs: {x: act.y}}",
    )
    assert "GRAPH004" in codes(run_doctor([graph(tmp_path, text)]).findings)


def test_malformed_yaml_has_line_and_column(tmp_path: Path) -> None:
    fs = run_doctor([graph(tmp_path, "name: x\nnodes:\n  a: {fn: [unclosed\n")]).findings
    assert codes(fs) == ["GRAPH001"]
    assert fs[0].location.line is not None and fs[0].location.column is not None


def test_dry_run_catches_a_runtime_contract_break(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "doctor_dry_run_ops.py").write_text(
        "import numpy as np\n\ndef to_float64(feats):\n    return {'x': feats.astype(np.float64)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = GOOD.replace(
        "  act: {model: relu, inputs: {x: inputs.feats}}",
        "  pre: {fn: 'doctor_dry_run_ops:to_float64', inputs: {feats: inputs.feats}}\n"
        "  act: {model: relu, inputs: {x: pre.x}}",
    )
    path = graph(tmp_path, text)
    assert run_doctor([path]).findings == []  # statically the fn output is unknown
    fs = run_doctor([path], dry_run=True).findings
    assert codes(fs) == ["GRAPH020"]
    f = fs[0]
    assert f.stage is Stage.DRY_RUN and "float64" in f.evidence["error"]
    assert f.evidence["inputs"] == {"feats": ([2, 3], "float32")}


def test_dry_run_of_a_valid_graph(tmp_path: Path, model_file: Path) -> None:
    assert run_doctor([graph(tmp_path, GOOD)], dry_run=True).findings == []


def test_dry_run_sends_timestamped_inputs_as_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # before: a `timestamped: true` input got a bare array, so the dry run of a correct graph (examples/lecture_index)
    # failed with GRAPH021 "frames: expected a list of timestamped items, got ndarray"
    (tmp_path / "doctor_stamped_ops.py").write_text(
        "def count(frames):\n    assert frames[0]['image'].ndim == 3 and frames[0]['ts_ms'] == 0.0\n"
        "    return {'n': len(frames)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (
        "name: stamped\n"
        "inputs:\n  frames: {modality: image, timestamped: true}\n"
        "nodes:\n  n: {fn: 'doctor_stamped_ops:count', inputs: {frames: inputs.frames}}\n"
        "outputs: {n: n.n}\n"
    )
    assert run_doctor([graph(tmp_path, text)], dry_run=True).findings == []


def test_graph_models_get_the_onnx_checks_once(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "relu.onnx"))
    path = graph(tmp_path, GOOD.replace("shape: [N, 3]", "shape: [1, 3]"))
    fs = run_doctor([path, tmp_path / "relu.onnx"]).findings
    assert codes(fs) == ["ONNX008"]
    assert fs[0].location.file.endswith("relu.onnx") and fs[0].evidence["batch"] == 1


def test_deploy_that_cannot_fill_a_batch_is_flagged(tmp_path: Path, model_file: Path) -> None:
    text = GOOD.replace(
        "relu: {backend: onnxruntime, path: relu.onnx}",
        "relu: {backend: onnxruntime, path: relu.onnx, batch: {max_size: 8}, options: {concurrency: 2}}",
    )
    ok = text + "deploy:\n  models:\n    relu: {num_replicas: 2}\n"
    assert run_doctor([graph(tmp_path, ok)]).findings == []
    tight = text + "deploy:\n  models:\n    relu: {num_replicas: 2, max_ongoing_requests: 4}\n"
    (f,) = run_doctor([graph(tmp_path, tight)]).findings
    assert f.code == "GRAPH010" and f.severity.value == "warning"
    assert "max_ongoing_requests 4 < batch max_size 8 × concurrency 2" in f.message
    assert (
        "at least 16" in f.fix
        and f.location.line == tight.splitlines().index("    relu: {num_replicas: 2, max_ongoing_requests: 4}") + 1
    )
    assert "batches of 8 can never form" in f.message
    # 12 requests fill one batch of 8, not two: before, this also said "batches of 8 can never form"
    half = text + "deploy:\n  models:\n    relu: {num_replicas: 2, max_ongoing_requests: 12}\n"
    (h,) = run_doctor([graph(tmp_path, half)]).findings
    assert h.code == "GRAPH010" and "at most 1 of its 2 concurrent batches can be full" in h.message, h.message
    bad = text + "deploy:\n  models:\n    rleu: {num_replicas: 2}\n"
    (g,) = run_doctor([graph(tmp_path, bad)]).findings
    assert g.code == "GRAPH002" and "did you mean 'relu'" in g.fix
