"""Triton checks: repositories built in tmp_path, one defect each; assert code, evidence, line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from usg.doctor import Severity, run_doctor
from usg.doctor.findings import Finding

pytest.importorskip("tritonclient.grpc.model_config_pb2")


def relu_onnx(shape: list[Any], dtype: int = T.FLOAT) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, shape)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


GOOD = """
name: "det"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 3, -1, -1 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP32
    dims: [ 3, -1, -1 ]
  }
]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def write_model(repo: Path, name: str, config: str, files: dict[str, Any] | None = None) -> Path:
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config)
    for rel, content in (files or {}).items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, onnx.ModelProto):
            onnx.save(content, str(p))
        elif content is None:
            p.mkdir(exist_ok=True)
        else:
            p.write_text(content)
    return d


def det(repo: Path, config: str = GOOD, shape: list[Any] | None = None, dtype: int = T.FLOAT) -> Path:
    return write_model(repo, "det", config, {"1/model.onnx": relu_onnx(shape or ["N", 3, "H", "W"], dtype)})


def triton_findings(path: Path) -> list[Finding]:
    return [f for f in run_doctor([path]).findings if f.code.startswith("TRITON")]


def only(fs: list[Finding], code: str) -> Finding:
    hits = [f for f in fs if f.code == code]
    assert len(hits) == 1, f"expected one {code}, got {[(f.code, f.message) for f in fs]}"
    return hits[0]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_valid_repository_has_no_findings(tmp_path: Path) -> None:
    det(tmp_path)
    report = run_doctor([tmp_path])
    assert report.findings == []
    assert [t.kind for t in report.targets] == ["triton_model", "onnx"]


def test_parse_error_has_line_and_column(tmp_path: Path) -> None:
    cfg = GOOD.replace("TYPE_FP32", "TYPE_FLOAT32", 1)
    d = det(tmp_path, cfg)
    f = only(triton_findings(d), "TRITON001")
    assert f.location.line == line_of(cfg, "TYPE_FLOAT32") and f.location.column is not None
    assert "TYPE_FLOAT32" in f.evidence["error"] and f.evidence["line_number"] == f.location.line


def test_name_differs_from_directory(tmp_path: Path) -> None:
    f = only(triton_findings(det(tmp_path, GOOD.replace('name: "det"', 'name: "detector"'))), "TRITON002")
    assert f.evidence == {"config_name": "detector", "directory": "det"} and f.location.line == 2


def test_zero_dim(tmp_path: Path) -> None:
    cfg = GOOD.replace("dims: [ 3, -1, -1 ]", "dims: [ 0, -1, -1 ]", 1)
    f = only(triton_findings(det(tmp_path, cfg)), "TRITON003")
    assert f.evidence["dims"] == [0, -1, -1] and f.evidence["bad_dims"] == [0]
    assert f.location.line == line_of(cfg, 'name: "x"')


def test_reshape_element_count(tmp_path: Path) -> None:
    cfg = GOOD.replace("dims: [ 3, -1, -1 ]", "dims: [ 3, 4, 4 ] reshape: { shape: [ 3, 15 ] }", 1)
    f = only(
        triton_findings(write_model(tmp_path, "det", cfg, {"1/model.onnx": relu_onnx(["N", 3, 15])})),
        "TRITON004",
    )
    assert f.evidence["dims_elements"] == 48 and f.evidence["reshape_elements"] == 45


def test_negative_max_batch_size(tmp_path: Path) -> None:
    fs = triton_findings(det(tmp_path, GOOD.replace("max_batch_size: 8", "max_batch_size: -2")))
    f = only(fs, "TRITON005")
    assert f.evidence["max_batch_size"] == -2
    # before: also a TRITON022 per tensor saying "(max_batch_size 0: dims are the full shape)" with a dims fix that
    # is wrong once max_batch_size is set positive
    assert not [x for x in fs if x.code in ("TRITON022", "TRITON024")], [(x.code, x.message) for x in fs]


def test_dynamic_batching_without_batching(tmp_path: Path) -> None:
    cfg = GOOD.replace("max_batch_size: 8", "max_batch_size: 0").replace("[ 3, -1, -1 ]", "[ -1, 3, -1, -1 ]")
    fs = triton_findings(det(tmp_path, cfg))
    f = only(fs, "TRITON006")
    assert f.evidence["max_batch_size"] == 0 and f.location.line == line_of(cfg, "dynamic_batching")
    assert "TRITON022" not in {x.code for x in fs}  # dims are the full shape: consistent with the model


def test_preferred_batch_size_above_max(tmp_path: Path) -> None:
    f = only(triton_findings(det(tmp_path, GOOD.replace("[ 4, 8 ]", "[ 4, 16 ]"))), "TRITON007")
    assert f.evidence["out_of_range"] == [16] and f.evidence["max_batch_size"] == 8


def test_cpu_instance_group_with_gpus(tmp_path: Path) -> None:
    cfg = GOOD.replace("{ kind: KIND_CPU count: 2 }", "{ kind: KIND_CPU count: 2 gpus: [ 0, 1 ] }")
    f = only(triton_findings(det(tmp_path, cfg)), "TRITON008")
    assert f.evidence == {"kind": "KIND_CPU", "gpus": [0, 1]}


def test_specific_version_without_folder(tmp_path: Path) -> None:
    cfg = GOOD + "version_policy: { specific: { versions: [ 1, 3 ] } }\n"
    f = only(triton_findings(det(tmp_path, cfg)), "TRITON009")
    assert f.evidence["missing"] == [3] and f.evidence["versions_present"] == [1]


def test_no_version_folder(tmp_path: Path) -> None:
    f = only(triton_findings(write_model(tmp_path, "det", GOOD)), "TRITON009")
    assert f.evidence["versions_present"] == []


def test_a_folder_named_with_a_non_ascii_digit_is_not_a_version(tmp_path: Path) -> None:
    # "²".isdigit() is True but int("²") raises: before, usg doctor ended in "internal error: ValueError"
    model = write_model(tmp_path, "det", GOOD)
    (model / "²").mkdir()
    f = only(run_doctor([tmp_path]).findings, "TRITON009")
    assert f.evidence["versions_present"] == []


def test_unknown_platform(tmp_path: Path) -> None:
    f = only(triton_findings(det(tmp_path, GOOD.replace("onnxruntime_onnx", "onnx_runtime"))), "TRITON010")
    assert f.evidence["platform"] == "onnx_runtime" and "onnxruntime_onnx" in f.evidence["known"]


def test_platform_contradicts_backend(tmp_path: Path) -> None:
    cfg = GOOD.replace('platform: "onnxruntime_onnx"', 'platform: "onnxruntime_onnx"\nbackend: "tensorrt"')
    f = only(triton_findings(det(tmp_path, cfg)), "TRITON010")
    assert f.evidence == {"platform": "onnxruntime_onnx", "backend": "tensorrt"}


def test_model_file_missing_in_version_folder(tmp_path: Path) -> None:
    cfg = GOOD.replace('platform: "onnxruntime_onnx"', 'backend: "onnxruntime"')
    d = write_model(tmp_path, "det", cfg, {"1/det.onnx": relu_onnx(["N", 3, "H", "W"])})
    f = only(triton_findings(d), "TRITON011")
    assert f.evidence["expected_file"] == "model.onnx" and f.evidence["files"] == ["det.onnx"]
    assert f.evidence["version"] == 1
    # default_model_filename fixes it
    (d / "config.pbtxt").write_text(cfg + 'default_model_filename: "det.onnx"\n')
    assert triton_findings(d) == []


def test_custom_backend_is_a_warning(tmp_path: Path) -> None:
    cfg = GOOD.replace('platform: "onnxruntime_onnx"', 'backend: "my_backend"')
    f = only(triton_findings(write_model(tmp_path, "det", cfg, {"1": None})), "TRITON014")
    assert f.severity is Severity.WARNING and f.evidence["backend"] == "my_backend"


def test_missing_data_type_and_duplicate_names(tmp_path: Path) -> None:
    cfg = GOOD.replace('output [\n  {\n    name: "y"\n    data_type: TYPE_FP32', 'output [\n  {\n    name: "y"')
    cfg = cfg.replace("input [\n", 'input [\n  { name: "x" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] },\n')
    fs = triton_findings(det(tmp_path, cfg))
    assert only(fs, "TRITON012").evidence == {"tensor": "y"}
    assert only(fs, "TRITON013").evidence == {"name": "x"}


# --- cross-check against the ONNX model -------------------------------------------------------


def test_config_tensor_name_not_in_model(tmp_path: Path) -> None:
    cfg = GOOD.replace('name: "x"', 'name: "images"')
    fs = triton_findings(det(tmp_path, cfg))
    f = next(f for f in fs if f.code == "TRITON020" and f.evidence.get("tensor") == "images")
    assert f.evidence["model_tensors"] == ["x"]
    missing = next(f for f in fs if f.code == "TRITON020" and "missing" in f.evidence)
    assert missing.evidence["missing"] == ["x"]


def test_dtype_differs_from_model(tmp_path: Path) -> None:
    fs = triton_findings(det(tmp_path, GOOD, dtype=T.FLOAT16))
    f = next(f for f in fs if f.code == "TRITON021" and f.evidence["tensor"] == "x")
    assert f.evidence["config_dtype"] == "TYPE_FP32" and f.evidence["model_dtype"] == "FLOAT16"
    assert "TYPE_FP16" in f.fix


def test_dims_differ_from_model(tmp_path: Path) -> None:
    # a fixed config dim is fine where the model is dynamic...
    assert triton_findings(det(tmp_path, GOOD.replace("[ 3, -1, -1 ]", "[ 3, 640, 640 ]"))) == []
    fs = triton_findings(det(tmp_path, GOOD.replace("[ 3, -1, -1 ]", "[ 1, -1, -1 ]", 1)))
    f = only(fs, "TRITON022")
    assert f.evidence["config_dims"] == [1, -1, -1] and f.evidence["model_shape"] == [-1, 3, -1, -1]
    # ...but a variable config dim is not where the model is fixed (Triton rejects it at load)
    fs = triton_findings(det(tmp_path, GOOD, shape=["N", 3, 640, 640]))
    assert {f.evidence["tensor"] for f in fs if f.code == "TRITON022"} == {"x", "y"}


def test_fixed_batch_dim_with_max_batch_size(tmp_path: Path) -> None:
    fs = triton_findings(det(tmp_path, GOOD, shape=[1, 3, "H", "W"]))
    f = next(f for f in fs if f.code == "TRITON023" and f.evidence["tensor"] == "x")
    assert f.evidence["max_batch_size"] == 8 and f.evidence["model_shape"] == [1, 3, -1, -1]
    assert "max_batch_size: 0" in f.fix


def test_batch_dim_listed_inside_dims(tmp_path: Path) -> None:
    fs = triton_findings(det(tmp_path, GOOD.replace("[ 3, -1, -1 ]", "[ -1, 3, -1, -1 ]", 1)))
    f = only(fs, "TRITON024")
    assert f.evidence["config_dims"] == [-1, 3, -1, -1] and "[3, -1, -1]" in f.fix


# --- ensembles --------------------------------------------------------------------------------

STEP = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: {in_type} dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: {out_type} dims: [ {out_dims} ] }} ]
"""


def step(
    repo: Path,
    name: str,
    mbs: int = 8,
    in_type: str = "TYPE_FP32",
    out_type: str = "TYPE_FP32",
    out_dims: str = "-1",
) -> None:
    write_model(
        repo,
        name,
        STEP.format(name=name, mbs=mbs, in_type=in_type, out_type=out_type, out_dims=out_dims),
        {"1/model.py": "# step\n"},
    )


def ensemble(repo: Path, steps: str, mbs: int = 8, out_type: str = "TYPE_FP32") -> Path:
    cfg = f"""
name: "pipe"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "RAW" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "RESULT" data_type: {out_type} dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {steps} ] }}
"""
    return write_model(repo, "pipe", cfg, {"1": None})


def two_steps(a_in: str = "RAW", a_out: str = "MID", b_in: str = "MID", b_out: str = "RESULT") -> str:
    return (
        f'{{ model_name: "a" model_version: -1 input_map {{ key: "IN" value: "{a_in}" }} '
        f'output_map {{ key: "OUT" value: "{a_out}" }} }},'
        f'{{ model_name: "b" model_version: -1 input_map {{ key: "IN" value: "{b_in}" }} '
        f'output_map {{ key: "OUT" value: "{b_out}" }} }}'
    )


def test_valid_ensemble(tmp_path: Path) -> None:
    step(tmp_path, "a")
    step(tmp_path, "b")
    ensemble(tmp_path, two_steps())
    assert run_doctor([tmp_path]).findings == []


def test_ensemble_unknown_step_model(tmp_path: Path) -> None:
    step(tmp_path, "a")
    findings = triton_findings(ensemble(tmp_path, two_steps()))
    f = only(findings, "TRITON031")
    assert f.evidence == {"step": 1, "model_name": "b", "repositories": [str(tmp_path)]}
    # b's outputs count as produced: no "ensemble output 'RESULT' is produced by no step" cascade
    assert [x.code for x in findings if x.code.startswith("TRITON03")] == ["TRITON031"]


def test_ensemble_unmapped_and_unproduced(tmp_path: Path) -> None:
    step(tmp_path, "a")
    step(tmp_path, "b")
    fs = triton_findings(ensemble(tmp_path, two_steps(b_in="NOWHERE")))
    hits = [f for f in fs if f.code == "TRITON032"]
    assert [h.evidence.get("tensor") for h in hits] == ["NOWHERE"]
    fs = triton_findings(ensemble(tmp_path, two_steps(b_out="OTHER")))
    assert only(fs, "TRITON032").evidence == {"tensor": "RESULT"}


def test_ensemble_tensor_produced_twice(tmp_path: Path) -> None:
    step(tmp_path, "a")
    step(tmp_path, "b")
    f = only(triton_findings(ensemble(tmp_path, two_steps(b_in="RAW", a_out="RESULT"))), "TRITON033")
    assert f.evidence["tensor"] == "RESULT" and len(f.evidence["producers"]) == 2


def test_ensemble_cycle(tmp_path: Path) -> None:
    step(tmp_path, "a")
    step(tmp_path, "b")
    fs = triton_findings(ensemble(tmp_path, two_steps(a_in="BACK", b_out="BACK")))
    f = only(fs, "TRITON034")
    assert f.evidence["cycle"] == ["0:a", "1:b", "0:a"]


def test_ensemble_dtype_and_shape_mismatch(tmp_path: Path) -> None:
    step(tmp_path, "a", out_type="TYPE_INT64", out_dims="-1, 4")
    step(tmp_path, "b")
    fs = triton_findings(ensemble(tmp_path, two_steps()))
    d = only(fs, "TRITON035")
    assert (d.evidence["producer_dtype"], d.evidence["consumer_dtype"]) == ("TYPE_INT64", "TYPE_FP32")
    s = only(fs, "TRITON036")
    assert (s.evidence["producer_dims"], s.evidence["consumer_dims"]) == ([-1, 4], [-1])


def test_ensemble_max_batch_size_above_step(tmp_path: Path) -> None:
    step(tmp_path, "a", mbs=4)
    step(tmp_path, "b")
    f = only(triton_findings(ensemble(tmp_path, two_steps(), mbs=8)), "TRITON037")
    assert f.evidence["step_max_batch_size"] == 4 and f.evidence["ensemble_max_batch_size"] == 8


def _step(model: str, key_in: str, value_in: str, key_out: str, value_out: str) -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{key_in}" value: "{value_in}" }} '
        f'output_map {{ key: "{key_out}" value: "{value_out}" }} }}'
    )


def test_an_ensemble_that_is_its_own_step(tmp_path: Path) -> None:
    # before: no finding at all (Triton refuses it: "circular dependency between ensembles")
    step(tmp_path, "a")
    steps = _step("a", "IN", "RAW", "OUT", "MID") + "," + _step("pipe", "RAW", "MID", "RESULT", "RESULT")
    f = only(triton_findings(ensemble(tmp_path, steps)), "TRITON039")
    assert f.evidence == {"chain": ["pipe", "pipe"]} and f.location.element == "step[1] pipe"
    assert "is a step of itself: pipe -> pipe" in f.message and "remove step 1 ('pipe')" in f.fix


def test_ensembles_that_are_steps_of_each_other(tmp_path: Path) -> None:
    inner = """
name: "inner"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ STEP ] }
""".replace("STEP", _step("pipe", "RAW", "RAW", "RESULT", "RESULT"))
    write_model(tmp_path, "inner", inner, {"1": None})
    f = only(triton_findings(ensemble(tmp_path, _step("inner", "RAW", "RAW", "RESULT", "RESULT"))), "TRITON039")
    assert f.evidence == {"chain": ["pipe", "inner", "pipe"]}


def test_nested_ensembles_without_a_loop_are_fine(tmp_path: Path) -> None:
    step(tmp_path, "a")
    step(tmp_path, "b")
    inner = ensemble(tmp_path, two_steps())
    inner.rename(tmp_path / "inner")
    (tmp_path / "inner" / "config.pbtxt").write_text(
        (tmp_path / "inner" / "config.pbtxt").read_text().replace('name: "pipe"', 'name: "inner"')
    )
    codes = [f.code for f in triton_findings(ensemble(tmp_path, _step("inner", "RAW", "RAW", "RESULT", "RESULT")))]
    assert "TRITON039" not in codes


def full_shape_ensemble(repo: Path, out_dims: str, mbs: int = 0) -> Path:
    """RAW -> a -> b -> RESULT with the ensemble's output dims chosen by the test."""
    cfg = f"""
name: "pipe"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "RAW" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "RESULT" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]
ensemble_scheduling {{ step [ {two_steps()} ] }}
"""
    return write_model(repo, "pipe", cfg, {"1": None})


def test_ensemble_tensors_between_batching_and_non_batching_models_compare_full_shapes(tmp_path: Path) -> None:
    # Triton accepts dims [4] of a batching step (full shape [-1, 4]) for a non-batching
    # ensemble's [-1, 4] (its ensemble scheduler turns the first dim into the batch dim)
    step(tmp_path, "a")
    step(tmp_path, "b", out_dims="4")
    assert triton_findings(full_shape_ensemble(tmp_path, "-1, 4")) == []
    s = only(triton_findings(full_shape_ensemble(tmp_path, "-1, 5")), "TRITON036")
    assert (s.evidence["producer_full_shape"], s.evidence["consumer_full_shape"]) == ([-1, 4], [-1, 5])


def test_a_batching_ensemble_may_hold_a_non_batching_step(tmp_path: Path) -> None:
    step(tmp_path, "a", mbs=0)
    step(tmp_path, "b")
    assert "TRITON037" not in {f.code for f in triton_findings(ensemble(tmp_path, two_steps(), mbs=8))}
