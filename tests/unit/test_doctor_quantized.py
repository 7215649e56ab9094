"""ONNX030 / ONNX031: a quantized model checked against the EP that runs it (usg doctor on QDQ files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from usg.doctor import Severity, run_doctor


def _qdq_layernorm(path: Path, zero_point_dtype: type = np.uint8) -> Path:
    """x → Q → DQ → LayerNormalization → Q → DQ → y: a LayerNorm wrapped in Q/DQ (uint8, asymmetric)."""
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(128, zero_point_dtype), "z"),
        numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(4, np.float32), "beta"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
        helper.make_node("LayerNormalization", ["xd", "gamma", "beta"], ["ln"], name="ln0", axis=-1),
        helper.make_node("QuantizeLinear", ["ln", "s", "z"], ["lnq"], name="q_out"),
        helper.make_node("DequantizeLinear", ["lnq", "s", "z"], ["y"], name="dq_out"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _codes(findings: list, code: str) -> list:
    return [f for f in findings if f.code == code]


def test_qdq_around_layernorm_is_onnx030_naming_the_node_and_the_fix(tmp_path: Path) -> None:
    findings = run_doctor([_qdq_layernorm(tmp_path / "m.onnx")]).findings
    (f,) = _codes(findings, "ONNX030")
    assert f.severity is Severity.WARNING
    assert "LayerNormalization" in f.message and "'ln0'" in f.message
    assert f.evidence["nodes"] == ["ln0"] and "keep it in FP32" in f.fix
    assert not _codes(findings, "ONNX031")  # TensorRT is checked only when it is a target


def test_uint8_asymmetric_qdq_is_onnx031_for_tensorrt(tmp_path: Path) -> None:
    findings = run_doctor([_qdq_layernorm(tmp_path / "m.onnx")], targets="tensorrt=10.3").findings
    trt = _codes(findings, "ONNX031")
    assert trt and all(f.severity is Severity.ERROR for f in trt)
    assert all(f.evidence["target"] == "tensorrt" for f in trt)


def test_a_float_model_gets_no_quantization_findings(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f.onnx")
    findings = run_doctor([tmp_path / "f.onnx"], targets="tensorrt=10.3").findings
    assert not _codes(findings, "ONNX030") and not _codes(findings, "ONNX031")
