"""ONNX checks: one model per defect, built with onnx.helper; assert code and evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from usg.doctor import Severity, run_doctor
from usg.doctor.findings import Finding


def vi(name: str, dtype: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    *,
    inits: list[onnx.TensorProto] = (),
    opset: int = 17,
    ir: int = 8,
    domains: dict[str, int] | None = None,
) -> onnx.ModelProto:  # type: ignore[assignment]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = ir
    return m


def save(tmp_path: Path, m: onnx.ModelProto, name: str = "m.onnx") -> Path:
    p = tmp_path / name
    onnx.save(m, str(p))
    return p


def relu_model(shape: list[Any], **kw: Any) -> onnx.ModelProto:
    return model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [vi("x", T.FLOAT, shape)],
        [vi("y", T.FLOAT, shape)],
        **kw,
    )


def findings(path: Path, targets: str | None = None) -> list[Finding]:
    return run_doctor([path], targets=targets).findings


def only(fs: list[Finding], code: str) -> Finding:
    hits = [f for f in fs if f.code == code]
    assert len(hits) == 1, f"expected one {code}, got {[f.code for f in fs]}"
    return hits[0]


def codes(fs: list[Finding]) -> set[str]:
    return {f.code for f in fs}


def test_clean_dynamic_model_has_no_findings(tmp_path: Path) -> None:
    assert findings(save(tmp_path, relu_model(["N", 3]))) == []


def test_unparsable_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")
    f = only(findings(p), "ONNX018")
    assert f.severity is Severity.ERROR and f.evidence["size_bytes"] == p.stat().st_size


def test_model_over_protobuf_limit_without_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.doctor.onnx import checks as onnx_checks

    p = save(tmp_path, relu_model(["N", 3]))
    monkeypatch.setattr(onnx_checks, "PROTOBUF_LIMIT", 16)
    f = only(findings(p), "ONNX017")
    assert f.evidence == {"size_bytes": p.stat().st_size, "limit_bytes": 16}
    assert "save_as_external_data=True" in f.fix


def test_checker_failure_skips_the_session(tmp_path: Path) -> None:
    m = model(
        [helper.make_node("Relu", ["nope"], ["y"], name="r")],
        [vi("x", T.FLOAT, ["N"])],
        [vi("y", T.FLOAT, ["N"])],
    )
    fs = findings(save(tmp_path, m))
    f = only(fs, "ONNX001")
    assert "nope" in f.evidence["error"]
    assert only(fs, "ONNX007").severity is Severity.INFO
    assert "ONNX006" not in codes(fs) and "ONNX021" not in codes(fs)


def test_shape_inference_failure(tmp_path: Path) -> None:
    a = numpy_helper.from_array(np.ones((2, 3), np.float32), "a")
    b = numpy_helper.from_array(np.ones((4, 5), np.float32), "b")
    m = model(
        [
            helper.make_node("Add", ["a", "b"], ["c"], name="bad_add"),
            helper.make_node("Add", ["x", "c"], ["y"], name="add2"),
        ],
        [vi("x", T.FLOAT, ["N", 3])],
        [vi("y", T.FLOAT, ["N", 3])],
        inits=[a, b],
    )
    f = only(findings(save(tmp_path, m)), "ONNX002")
    assert f.evidence["op_type"] == "Add" and f.evidence["node"] == "bad_add"
    assert "bad_add" in (f.location.element or "")


def test_ir_and_opset_vs_target_ort(tmp_path: Path) -> None:
    p = save(tmp_path, relu_model(["N", 3], opset=21, ir=10))
    fs = findings(p, "ort=1.14")
    ir = only(fs, "ONNX003")
    assert ir.evidence["model_ir_version"] == 10 and ir.evidence["max_ir_version"] == 8
    op = only(fs, "ONNX004")
    assert op.evidence["model_opset"] == 21 and op.evidence["max_opset"] == 18
    assert op.evidence["runtime_version"] == "1.14"
    assert codes(findings(p, "ort=1.20")) == set()


def test_opset_vs_target_tensorrt(tmp_path: Path) -> None:
    p = save(tmp_path, relu_model(["N", 3], opset=19, ir=9))
    f = only(findings(p, "tensorrt=8.6"), "ONNX004")
    assert f.evidence["runtime"] == "tensorrt" and f.evidence["max_opset"] == 17
    assert f.evidence["model_opset"] == 19


def test_a_release_older_than_the_tables_is_bounded_by_the_oldest_row(tmp_path: Path) -> None:
    # before: ort=1.5 and tensorrt=7.2 matched no table row and the model passed unchecked
    p = save(tmp_path, relu_model(["N", 3], opset=21, ir=10))
    fs = findings(p, "ort=1.5,tensorrt=7.2")
    assert only(fs, "ONNX003").evidence["max_ir_version"] == 7
    ort, trt = sorted((f for f in fs if f.code == "ONNX004"), key=lambda f: f.evidence["runtime"])
    assert ort.evidence["max_opset"] == 12
    assert "predates ONNX Runtime 1.6, which supports at most opset 12" in ort.message
    assert trt.evidence["max_opset"] == 13 and "predates TensorRT 8.0" in trt.message
    assert codes(findings(save(tmp_path, relu_model(["N", 3], opset=11, ir=6)), "ort=1.5,tensorrt=7.2")) == set()


def test_custom_domain_op(tmp_path: Path) -> None:
    m = model(
        [helper.make_node("FancyNorm", ["x"], ["y"], name="fn", domain="acme.ops")],
        [vi("x", T.FLOAT, ["N", 3])],
        [vi("y", T.FLOAT, ["N", 3])],
        domains={"acme.ops": 1},
    )
    fs = findings(save(tmp_path, m))
    f = only(fs, "ONNX005")
    assert f.evidence["domain"] == "acme.ops" and f.evidence["op_type"] == "FancyNorm"
    assert f.evidence["nodes"] == ["fn"]
    assert "ONNX006" not in codes(fs)  # no second finding for the same op from the session


def test_op_the_installed_ort_cannot_run(tmp_path: Path) -> None:
    # Relu at opset 5 resolves to Relu-1, for which ONNX Runtime has no kernel.
    p = save(tmp_path, relu_model(["N", 3], opset=5, ir=3))
    f = only(findings(p), "ONNX006")
    assert f.evidence["op_type"] == "Relu" and f.evidence["op_since_version"] == 1
    assert f.evidence["model_opset"] == 5 and f.location.element == "relu"


def test_fixed_batch_dim_is_a_warning(tmp_path: Path) -> None:
    f = only(findings(save(tmp_path, relu_model([1, 3, 8, 8]))), "ONNX008")
    assert f.severity is Severity.WARNING
    assert f.evidence["batch"] == 1 and f.evidence["shape"] == [1, 3, 8, 8]


def test_batch_frozen_into_reshape_is_an_error(tmp_path: Path) -> None:
    shape = numpy_helper.from_array(np.array([2, 12], np.int64), "target_shape")
    m = model(
        [helper.make_node("Reshape", ["x", "target_shape"], ["y"], name="flatten")],
        [vi("x", T.FLOAT, [2, 3, 4])],
        [vi("y", T.FLOAT, [2, 12])],
        inits=[shape],
    )
    fs = findings(save(tmp_path, m))
    f = only(fs, "ONNX009")
    assert f.evidence["batch"] == 2
    assert f.evidence["frozen_nodes"] == [{"node": "flatten", "op_type": "Reshape", "shape": [2, 12]}]
    assert "ONNX008" not in codes(fs)


def test_static_output_from_dynamic_input(tmp_path: Path) -> None:
    shape = numpy_helper.from_array(np.array([4, 3], np.int64), "s")
    m = model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [vi("x", T.FLOAT, ["N", 3])],
        [vi("y", T.FLOAT, [4, 3])],
        inits=[shape],
    )
    f = only(findings(save(tmp_path, m)), "ONNX010")
    assert f.evidence["output_shape"] == [4, 3] and f.evidence["dynamic_inputs"] == ["x"]


def _resize_model(**attrs: Any) -> onnx.ModelProto:
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", **attrs)
    return model([node], [vi("x", T.FLOAT, ["N", 3, 8, 8])], [vi("y", T.FLOAT, ["N", 3, 16, 16])], inits=[scales])


def test_resize_linear_asymmetric_drifts(tmp_path: Path) -> None:
    p = save(tmp_path, _resize_model(mode="linear", coordinate_transformation_mode="asymmetric"))
    f = only(findings(p), "ONNX011")
    assert f.evidence["mode"] == "linear" and f.evidence["coordinate_transformation_mode"] == "asymmetric"
    assert "nn.Upsample" in f.evidence["produced_by"] and "TensorRT" in f.message
    assert f.evidence["nodes"] == ["up"]


def test_resize_pytorch_nearest_export_is_not_flagged(tmp_path: Path) -> None:
    # F.interpolate(mode="nearest") exports asymmetric + floor: every runtime agrees.
    p = save(
        tmp_path,
        _resize_model(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    )
    assert "ONNX011" not in codes(findings(p))


def test_resize_nearest_align_corners_drifts(tmp_path: Path) -> None:
    p = save(tmp_path, _resize_model(mode="nearest", coordinate_transformation_mode="align_corners"))
    f = only(findings(p), "ONNX011")
    assert f.evidence["nearest_mode"] == "round_prefer_floor"


def test_fp16_softmax_overflow_risk(tmp_path: Path) -> None:
    m = model(
        [helper.make_node("Softmax", ["x"], ["y"], name="attn_softmax", axis=-1)],
        [vi("x", T.FLOAT16, ["N", 512])],
        [vi("y", T.FLOAT16, ["N", 512])],
    )
    f = only(findings(save(tmp_path, m)), "ONNX012")
    assert f.evidence["op_type"] == "Softmax" and f.evidence["nodes"] == ["attn_softmax"]
    assert f.evidence["dtype"] == "float16"


def test_fp32_softmax_is_fine(tmp_path: Path) -> None:
    m = model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [vi("x", T.FLOAT, ["N", 512])],
        [vi("y", T.FLOAT, ["N", 512])],
    )
    assert findings(save(tmp_path, m)) == []


def test_int64_input_is_info_then_warning_for_tensorrt(tmp_path: Path) -> None:
    m = model(
        [helper.make_node("Identity", ["ids"], ["y"])],
        [vi("ids", T.INT64, ["N", "seq"])],
        [vi("y", T.INT64, ["N", "seq"])],
    )
    p = save(tmp_path, m)
    assert only(findings(p), "ONNX013").severity is Severity.INFO
    f = only(findings(p, "tensorrt=10.3"), "ONNX013")
    assert f.severity is Severity.WARNING and f.evidence["tensorrt"] == "10.3"
    assert f.evidence["input"] == "ids" and f.evidence["dtype"] == "int64"


def test_missing_external_data(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", T.FLOAT, ["N", 64])],
        [vi("y", T.FLOAT, ["N", 64])],
        inits=[w],
    )
    p = tmp_path / "ext.onnx"
    onnx.save_model(
        m,
        str(p),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    assert findings(p) == []
    (tmp_path / "ext.onnx.data").unlink()
    fs = findings(p)
    f = only(fs, "ONNX014")
    assert f.evidence["location"] == "ext.onnx.data" and f.evidence["tensors"] == ["w"]
    assert {x.code for x in fs if x.severity is Severity.ERROR} == {"ONNX014"}


def test_unused_initializer_and_input(tmp_path: Path) -> None:
    dead = numpy_helper.from_array(np.zeros(10, np.float32), "dead_weight")
    m = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", T.FLOAT, ["N", 3]), vi("mask", T.FLOAT, ["N", 3])],
        [vi("y", T.FLOAT, ["N", 3])],
        inits=[dead],
    )
    fs = findings(save(tmp_path, m))
    init = only(fs, "ONNX015")
    assert init.evidence["initializers"] == ["dead_weight"] and init.evidence["raw_bytes"] == 40
    assert only(fs, "ONNX016").evidence["input"] == "mask"


def test_resize_trt_cannot_import_is_an_error_when_deploying_to_tensorrt(tmp_path: Path) -> None:
    p = save(tmp_path, _resize_model(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"))
    assert only(findings(p), "ONNX011").severity is Severity.WARNING
    f = only(findings(p, "tensorrt=10.3"), "ONNX011")
    assert f.severity is Severity.ERROR and f.evidence["tensorrt"] == "10.3"
    assert f.evidence["coordinate_transformation_mode"] == "tf_crop_and_resize"


def test_an_empty_file_is_named_empty_not_a_bad_ir_version(tmp_path: Path) -> None:
    p = tmp_path / "m.onnx"
    p.write_bytes(b"")
    fs = findings(p)
    f = only(fs, "ONNX018")
    assert "empty (0 bytes)" in f.message and "again" in f.fix and "ONNX001" not in codes(fs)


def test_a_graph_without_outputs_is_an_error(tmp_path: Path) -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", T.FLOAT, ["N", 3])], [])
    f = only(findings(save(tmp_path, m)), "ONNX019")
    assert f.severity is Severity.ERROR and "output_names" in f.fix


@pytest.mark.parametrize(("shape", "axis", "value"), [([-5, 3], 0, -5), (["N", -2], 1, -2)])
def test_a_negative_declared_dimension_is_named(tmp_path: Path, shape: list[Any], axis: int, value: int) -> None:
    fs = findings(save(tmp_path, relu_model(shape)))
    hits = [f for f in fs if f.code == "ONNX020"]
    assert hits and all(f.severity is Severity.WARNING for f in hits)
    assert (hits[0].evidence["axis"], hits[0].evidence["dim_value"]) == (axis, value)
    assert hits[0].evidence["input"] == "x"


def test_minus_one_the_paddle_and_triton_dynamic_size_is_not_flagged(tmp_path: Path) -> None:
    # rapidocr's ch_ppocr_mobile_v2.0_cls_infer.onnx (Paddle2ONNX) declares [-1, 3, 48, 192]
    assert "ONNX020" not in codes(findings(save(tmp_path, relu_model([-1, 3]))))
