"""check_qdq on small hand-built quantized models (and one ORT really quantized)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from usg.quantize.qdq_check import check_qdq  # noqa: E402


def _qdq_model(op: str, *, zp_type: int = TensorProto.UINT8, zp: int = 128) -> onnx.ModelProto:
    """x → Q → DQ → op → Q → DQ → y, with a scale and zero point per Q/DQ."""
    zp_arr = np.array(zp, dtype=np.uint8 if zp_type == TensorProto.UINT8 else np.int8)
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(zp_arr, "zp")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="x_dq"),
    ]
    if op == "LayerNormalization":
        inits += [
            numpy_helper.from_array(np.ones(4, np.float32), "g"),
            numpy_helper.from_array(np.zeros(4, np.float32), "b"),
        ]
        nodes.append(helper.make_node(op, ["xd", "g", "b"], ["h"], name="ln", axis=-1))
    else:
        nodes.append(helper.make_node(op, ["xd", "xd"] if op in ("Add", "Mul") else ["xd"], ["h"], name="body"))
    nodes += [
        helper.make_node("QuantizeLinear", ["h", "s", "zp"], ["hq"], name="h_q"),
        helper.make_node("DequantizeLinear", ["hq", "s", "zp"], ["y"], name="h_dq"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_layernorm_wrapped_in_qdq_is_reported_for_the_cpu_ep():
    problems = check_qdq(_qdq_model("LayerNormalization"), "cpu")
    assert [(p.op, p.node) for p in problems] == [("LayerNormalization", "ln")]
    assert "no INT8 kernel" in problems[0].problem
    assert "nodes_to_exclude=['ln']" in problems[0].fix


@pytest.mark.parametrize("op", ["Add", "Sigmoid", "Relu"])
def test_ops_the_cpu_ep_runs_in_int8_are_fine(op):
    assert check_qdq(_qdq_model(op), "cpu") == []


def test_cuda_runs_qdq_arithmetic_in_float():
    problems = check_qdq(_qdq_model("Add"), "cuda")
    assert [p.op for p in problems] == ["Add"]
    assert "TensorRT EP" in problems[0].fix
    assert check_qdq(_qdq_model("Transpose"), "cuda") == []  # data movement only


def test_tensorrt_refuses_uint8_and_asymmetric_qdq_once_per_kind():
    problems = check_qdq(_qdq_model("Add"), "tensorrt")
    assert {p.op for p in problems} == {"QuantizeLinear", "DequantizeLinear"}
    assert all("uint8 zero point" in p.problem and "ActivationSymmetric" in p.fix for p in problems)
    assert check_qdq(_qdq_model("Add", zp_type=TensorProto.INT8, zp=0), "tensorrt") == []
    asym = check_qdq(_qdq_model("Add", zp_type=TensorProto.INT8, zp=3), "tensorrt")
    assert asym and "that is not 0" in asym[0].problem


def test_tensorrt_cannot_import_ort_integer_ops(tmp_path):
    """A model ORT's dynamic quantizer really produced (MatMulInteger, DynamicQuantizeLinear)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w],
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "m.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    problems = check_qdq(dst, "tensorrt")
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= {p.op for p in problems}
    assert all(p.target == "tensorrt" and p.fix for p in problems)
    assert check_qdq(dst, "cpu") == []  # no Q/DQ pairs: nothing for the CPU EP to complain about
    assert problems[0].to_json()["target"] == "tensorrt"


def test_unknown_target():
    with pytest.raises(ValueError, match="target 'npu': unknown; use one of cpu, cuda, tensorrt"):
        check_qdq(_qdq_model("Add"), "npu")
