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


def _needs_triton() -> None:
    pytest.importorskip("tritonclient", reason="Triton config checks need the triton extra: pip install 'usg[triton]'")


def test_ensemble_step_missing_everywhere_is_one_finding_not_a_cascade(tmp_path: Path) -> None:
    _needs_triton()
    ens = _copy(tmp_path, "qa/L0_lifecycle/ensemble_zero_1_float32", "lifecycle")
    findings = [f for f in run_doctor([ens.parent]).findings if f.location.file.startswith(str(ens))]
    assert _codes(findings, "TRITON03") == ["TRITON031"]
    [f] = [f for f in findings if f.code == "TRITON031"]
    assert f.evidence["model_name"] == "custom_zero_1_float32"


def test_ensemble_step_resolves_in_a_second_repository(tmp_path: Path) -> None:
    _needs_triton()
    ens = _copy(tmp_path, "qa/L0_lifecycle/ensemble_zero_1_float32", "lifecycle")
    step = _copy(tmp_path, "qa/custom_models/custom_zero_1_float32", "custom_models")
    report = run_doctor([ens.parent, step.parent])
    mine = [f for f in report.findings if f.location.file.startswith(str(ens))]
    assert mine == [], [(f.code, f.message) for f in mine]


def test_ensemble_wiring_is_still_checked_across_repositories(tmp_path: Path) -> None:
    _needs_triton()
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
    _needs_triton()
    d = _copy(tmp_path, f"docs/examples/model_repository/{name}")
    _sequence_model(d / "1" / "model.onnx", dyna=name == "simple_dyna_sequence")
    findings = run_doctor([d]).findings
    assert [(f.code, f.message) for f in findings if f.severity.value == "error"] == []
    assert "TRITON020" not in _codes(findings)


def test_undeclared_input_that_is_no_control_input_is_still_reported(tmp_path: Path) -> None:
    _needs_triton()
    d = _copy(tmp_path, "docs/examples/model_repository/simple_sequence")
    cfg = d / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "READY"', 'name: "NOT_READY"'))
    _sequence_model(d / "1" / "model.onnx", dyna=False)
    [f] = [f for f in run_doctor([d]).findings if f.code == "TRITON020"]
    assert f.evidence["missing"] == ["READY"]


def test_overridable_initializer_is_a_legitimate_input(tmp_path: Path) -> None:
    _needs_triton()
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


# Triton's ragged-batch QA model: qa/common/gen_qa_ragged_models.py (commit e1db8a6) writes this config with
# create_modelconfig(models_dir, 4, np.float32, "onnxruntime", "onnx") and the model with create_onnx_modelfile.
RAGGED_CONFIG = """
name: "onnx_batch_input"

backend: "onnxruntime"

max_batch_size: 4
version_policy: { latest { num_versions: 1 }}
input [
  {
    name: "RAGGED_INPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
    allow_ragged_batch: true
  }
]
output [
  {
    name: "RAGGED_OUTPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
   }
]
output [
  {
    name: "BATCH_AND_SIZE_OUTPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
   }
]
output [
  {
    name: "BATCH_OUTPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
   }
]
batch_input [
  {
    kind: BATCH_ELEMENT_COUNT
    target_name: "BATCH_AND_SIZE_INPUT"
    data_type: TYPE_FP32
    source_input: "RAGGED_INPUT"
  },
  {
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO
    target_name: "BATCH_INPUT"
    data_type: TYPE_FP32
    source_input: "RAGGED_INPUT"
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 1000000
}
"""


def _ragged_repository(tmp_path: Path, ragged_shape: list[int | str]) -> Path:
    d = tmp_path / "repo" / "onnx_batch_input"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(RAGGED_CONFIG)
    names = ("RAGGED", "BATCH_AND_SIZE", "BATCH")
    inputs = [helper.make_tensor_value_info(f"{n}_INPUT", T.FLOAT, [f"{n}_len"]) for n in names]
    inputs[0] = helper.make_tensor_value_info("RAGGED_INPUT", T.FLOAT, ragged_shape)
    outputs = [helper.make_tensor_value_info(f"{n}_OUTPUT", T.FLOAT, ["batch", f"{n}_out"]) for n in names]
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("const_shape", T.INT64, [2], [1, -1])),
        helper.make_node(
            "Constant", [], ["expander_shape"], value=helper.make_tensor("const_expander_shape", T.INT64, [2], [-1, 1])
        ),
        helper.make_node("Reshape", ["RAGGED_INPUT", "shape"], ["in_mat"]),
        helper.make_node("Reshape", ["BATCH_AND_SIZE_INPUT", "shape"], ["bs_mat"]),
        helper.make_node("Reshape", ["BATCH_INPUT", "shape"], ["batch_mat"]),
        helper.make_node("Div", ["BATCH_AND_SIZE_INPUT", "BATCH_AND_SIZE_INPUT"], ["output_expander_int"]),
        helper.make_node("Reshape", ["output_expander_int", "expander_shape"], ["output_expander"]),
        helper.make_node("MatMul", ["output_expander", "in_mat"], ["RAGGED_OUTPUT"]),
        helper.make_node("MatMul", ["output_expander", "bs_mat"], ["BATCH_AND_SIZE_OUTPUT"]),
        helper.make_node("MatMul", ["output_expander", "batch_mat"], ["BATCH_OUTPUT"]),
    ]
    _save(helper.make_graph(nodes, "onnx_batch_input", inputs, outputs), d / "1" / "model.onnx", 8, 13)
    return d


def test_ragged_input_and_batch_input_targets_are_model_inputs(tmp_path: Path) -> None:
    _needs_triton()
    findings = run_doctor([_ragged_repository(tmp_path, ["RAGGED_len"])]).findings
    assert [(f.code, f.message) for f in findings if f.code.startswith(("TRITON", "DOCTOR"))] == []


def test_ragged_input_the_model_does_not_take_flat_is_reported(tmp_path: Path) -> None:
    _needs_triton()
    findings = run_doctor([_ragged_repository(tmp_path, ["batch", 8])]).findings
    [f] = [f for f in findings if f.code.startswith("TRITON")]
    assert f.code == "TRITON022" and f.evidence["tensor"] == "RAGGED_INPUT"
    assert f.evidence["model_shape"] == [-1, 8] and "shape [-1]" in f.fix


# -- items 7-9: ONNX backend-test models and silero-vad -----------------------------------------

NODE_COPIES = Path(__file__).parents[1] / "resources" / "doctor" / "onnx_backend_node"


def backend_test_model(name: str) -> Path:
    """The model from the installed onnx package, or the unchanged copy (onnx 1.23 wheels dropped them)."""
    shipped = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node" / name / "model.onnx"
    return shipped if shipped.is_file() else NODE_COPIES / name / "model.onnx"


@pytest.mark.parametrize(
    "name", ["test_flexattention_causal_mask_expanded_ver26", "test_flexattention_relative_positional_expanded_ver26"]
)
def test_reshape_of_index_tensors_is_not_a_frozen_batch(name: str) -> None:
    pytest.importorskip("onnxruntime")
    from usg.doctor.onnx.probe import run_once

    path = backend_test_model(name)
    model = onnx.load(str(path))
    probe = run_once(model, batch=2, batch_inputs=["Q", "K", "V"])
    assert probe is not None and probe.ok and probe.output_shapes[0][0] == 2  # it really runs at batch 2
    findings = run_doctor([path]).findings
    assert "ONNX009" not in _codes(findings)
    assert _codes(findings, "ONNX008") == ["ONNX008"] * 3  # Q, K, V really are fixed at batch 1


def test_frozen_batch_is_proven_by_a_batch_2_run_and_reported_once(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    shape = helper.make_tensor("target", T.INT64, [2], [1, 24])
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["a", "target"], ["fa"], name="flat_a"),
            helper.make_node("Reshape", ["b", "target"], ["fb"], name="flat_b"),
            helper.make_node("Add", ["fa", "fb"], ["y"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("a", T.FLOAT, [1, 2, 12]),
            helper.make_tensor_value_info("b", T.FLOAT, [1, 2, 12]),
        ],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 24])],
        initializer=[shape],
    )
    path = tmp_path / "frozen.onnx"
    _save(graph, path, 8, 17)
    findings = run_doctor([path]).findings
    [f] = [f for f in findings if f.code == "ONNX009"]
    assert f.evidence["inputs"] == ["a", "b"]
    assert f.evidence["batch_probe"]["batch"] == 2 and f.evidence["batch_probe"]["runs"] is False
    assert "at batch 2 ONNX Runtime fails" in f.message
    assert "ONNX008" not in _codes(findings)


def test_recurrent_state_batch_axis_is_not_dim_0() -> None:
    silero = pytest.importorskip("silero_vad")
    path = Path(silero.__file__).parent / "data" / "silero_vad.onnx"
    findings = run_doctor([path]).findings
    [f] = [f for f in findings if f.code == "ONNX008"]
    assert f.evidence["input"] == "state" and f.evidence["batch_axis"] == 1
    assert "dynamic_axes" not in f.fix and "axis 1" in f.message
    assert [x for x in findings if x.severity.value == "error"] == []


def test_not_implemented_kernel_is_the_unsupported_op_code() -> None:
    pytest.importorskip("onnxruntime")
    findings = run_doctor([backend_test_model("test_cast_FLOAT_to_FLOAT4E2M1")]).findings
    [f] = [f for f in findings if f.severity.value == "error"]
    assert f.code == "ONNX006" and f.root_cause.value == "unsupported_op"
    assert f.evidence["op_type"] == "Cast" and f.evidence["op_since_version"] == 25
    assert "ONNX021" not in _codes(findings)


def test_onnxruntime_log_lines_stay_off_stderr(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import subprocess
    import sys

    code = (
        "import sys; from usg.doctor import run_doctor; "
        "r = run_doctor(sys.argv[1:]); print(sorted(f.code for f in r.findings))"
    )
    paths = [str(backend_test_model(n)) for n in ("test_cast_FLOAT_to_FLOAT4E2M1", "test_mvn")]
    done = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ONNX006" in done.stdout
    assert done.stderr == ""


def test_shape_inference_failing_inside_a_function_body_is_a_warning_when_ort_runs_it() -> None:
    pytest.importorskip("onnxruntime")
    findings = run_doctor([backend_test_model("test_mvn")]).findings
    [f] = [f for f in findings if f.code == "ONNX002"]
    assert f.severity.value == "warning" and f.evidence["function_op"] == "MeanVarianceNormalization"
    assert [x for x in findings if x.severity.value == "error"] == []
