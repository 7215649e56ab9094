"""No false errors on official examples (issue #20 items 5-9), each on the example named.

Triton configs are copied verbatim from triton-inference-server/server (see
``tests/resources/doctor/triton_official/PROVENANCE.md``); their tiny ``model.onnx`` files
are rebuilt here node for node with onnx.helper.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from usg.doctor import Finding, run_doctor

OFFICIAL = Path(__file__).parents[1] / "resources" / "doctor" / "triton_official"


def _copy(tmp_path: Path, rel: str, repo: str = "repo") -> Path:
    """Copy an official model folder into ``tmp_path/repo`` and add the version folder."""
    src = OFFICIAL / rel
    dst = tmp_path / repo / src.name
    shutil.copytree(src, dst)
    (dst / "1").mkdir(exist_ok=True)
    return dst


def _save(graph: onnx.GraphProto, path: Path, ir: int, opset: int) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _codes(findings: list[Finding], prefix: str = "") -> list[str]:
    return sorted(f.code for f in findings if f.code.startswith(prefix))


# -- item 5: ensembles across repositories ------------------------------------------------------


def test_ensemble_step_missing_everywhere_is_one_finding_not_a_cascade(tmp_path: Path) -> None:
    ens = _copy(tmp_path, "qa/L0_lifecycle/ensemble_zero_1_float32", "lifecycle")
    findings = [f for f in run_doctor([ens.parent]).findings if f.location.file.startswith(str(ens))]
    assert _codes(findings, "TRITON03") == ["TRITON031"]
    [f] = [f for f in findings if f.code == "TRITON031"]
    assert f.evidence["model_name"] == "custom_zero_1_float32"


def test_ensemble_step_resolves_in_a_second_repository(tmp_path: Path) -> None:
    ens = _copy(tmp_path, "qa/L0_lifecycle/ensemble_zero_1_float32", "lifecycle")
    step = _copy(tmp_path, "qa/custom_models/custom_zero_1_float32", "custom_models")
    report = run_doctor([ens.parent, step.parent])
    mine = [f for f in report.findings if f.location.file.startswith(str(ens))]
    assert mine == [], [(f.code, f.message) for f in mine]


def test_ensemble_wiring_is_still_checked_across_repositories(tmp_path: Path) -> None:
    ens = _copy(tmp_path, "qa/L0_lifecycle/ensemble_zero_1_float32", "lifecycle")
    step = _copy(tmp_path, "qa/custom_models/custom_zero_1_float32", "custom_models")
    cfg = step / "config.pbtxt"
    cfg.write_text(
        cfg.read_text().replace(
            'name: "OUTPUT0"\n    data_type: TYPE_FP32', 'name: "OUTPUT0"\n    data_type: TYPE_INT32'
        )
    )
    findings = [f for f in run_doctor([ens.parent, step.parent]).findings if f.location.file.startswith(str(ens))]
    assert _codes(findings, "TRITON03") == ["TRITON035"]


# -- item 6: sequence control inputs and overridable initializers are model inputs ---------------


def _sequence_model(path: Path, dyna: bool) -> None:
    names = ["INPUT", "START", "END", "READY", "CORRID"] if dyna else ["INPUT", "START", "READY"]
    inputs = [helper.make_tensor_value_info(n, T.UINT64 if n == "CORRID" else T.INT32, ["N", 1]) for n in names]
    nodes = [helper.make_node("Identity", ["INPUT"], ["_INPUT"])]
    if dyna:
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid32"], to=T.INT32),
            helper.make_node("Add", ["_INPUT", "START"], ["add0"]),
            helper.make_node("Mul", ["END", "corrid32"], ["mul0"]),
            helper.make_node("Add", ["add0", "mul0"], ["sum0"]),
            helper.make_node("Mul", ["READY", "sum0"], ["CAST"]),
        ]
    else:
        nodes += [
            helper.make_node("Add", ["_INPUT", "START"], ["add"]),
            helper.make_node("Mul", ["READY", "add"], ["CAST"]),
        ]
    nodes.append(helper.make_node("Cast", ["CAST"], ["OUTPUT"], to=T.INT32))
    out = helper.make_tensor_value_info("OUTPUT", T.INT32, ["N", 1])
    _save(helper.make_graph(nodes, "onnx_sequence_int32", inputs, [out]), path, 10, 21)


@pytest.mark.parametrize("name", ["simple_sequence", "simple_dyna_sequence"])
def test_sequence_control_inputs_are_model_inputs(tmp_path: Path, name: str) -> None:
    d = _copy(tmp_path, f"docs/examples/model_repository/{name}")
    _sequence_model(d / "1" / "model.onnx", dyna=name == "simple_dyna_sequence")
    findings = run_doctor([d]).findings
    assert [(f.code, f.message) for f in findings if f.severity.value == "error"] == []
    assert "TRITON020" not in _codes(findings)


def test_undeclared_input_that_is_no_control_input_is_still_reported(tmp_path: Path) -> None:
    d = _copy(tmp_path, "docs/examples/model_repository/simple_sequence")
    cfg = d / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "READY"', 'name: "NOT_READY"'))
    _sequence_model(d / "1" / "model.onnx", dyna=False)
    [f] = [f for f in run_doctor([d]).findings if f.code == "TRITON020"]
    assert f.evidence["missing"] == ["READY"]


def test_overridable_initializer_is_a_legitimate_input(tmp_path: Path) -> None:
    d = _copy(tmp_path, "qa/L0_initializer_as_input/models/add_with_initializer")
    init = helper.make_tensor("INITIALIZER", T.FLOAT, [5, 5], [0.0] * 25)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])],
        "init_input",
        [
            helper.make_tensor_value_info("INPUT", T.FLOAT, [5, 5]),
            helper.make_tensor_value_info("INITIALIZER", T.FLOAT, [5, 5]),
        ],
        [helper.make_tensor_value_info("OUTPUT", T.FLOAT, [5, 5])],
        initializer=[init],
    )
    _save(graph, d / "1" / "model.onnx", 8, 18)
    findings = run_doctor([d]).findings
    assert [(f.code, f.message) for f in findings if f.severity.value == "error"] == []
