"""Dynamic quantization of a model whose weights are Constant nodes (paddle2onnx exports, e.g. every
Conv of PP-OCRv4 det): before, ORT's quantizer raised "Expected W to be an initializer", shown as
"internal error" by `usg quantize --method dynamic`; now the constants become initializers first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from usg.quantize.methods import QuantSettings, quantize_model  # noqa: E402


def _conv_with_constant_weight(path: Path) -> None:
    w = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    b = np.arange(4, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
            helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b, "b")),
            helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_dynamic_quantization_of_constant_node_weights(tmp_path: Path) -> None:
    src, dst = tmp_path / "conv.onnx", tmp_path / "q" / "conv.dynamic.onnx"
    _conv_with_constant_weight(src)
    quantize_model(src, dst, QuantSettings("dynamic"))
    quantized = onnx.load(str(dst))
    assert "ConvInteger" in {n.op_type for n in quantized.graph.node}
    assert sorted(p.name for p in dst.parent.iterdir()) == ["conv.dynamic.onnx"]  # the folded copy is gone
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape and np.max(np.abs(got - want)) < 0.1 * np.max(np.abs(want))
