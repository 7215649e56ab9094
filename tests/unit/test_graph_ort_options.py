"""The ONNX Runtime backend's options are checked when the graph is built: a wrong value is a
graph problem naming the field and the fix, not an internal error when the model loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from usg.errors import GraphError
from usg.graph import load_graph
from usg.runtime import Executor


def _graph(tmp_path: Path, options: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "relu.onnx")
    path = tmp_path / "g.yaml"
    path.write_text(
        f"""
name: g
inputs: {{x: {{modality: tensor, dtype: float32, shape: [batch, 3]}}}}
models:
  relu: {{backend: onnxruntime, path: relu.onnx, options: {options}}}
nodes:
  relu: {{model: relu, inputs: {{x: inputs.x}}}}
outputs: {{y: relu.y}}
"""
    )
    return path


@pytest.mark.parametrize(
    ("options", "field", "fix"),
    [
        ("{optimization: fast}", "optimization", "use one of: all, extended, basic, disable"),
        ("{intra_op_threads: two}", "intra_op_threads", "a whole number of threads"),
        ("{inter_op_threads: -1}", "inter_op_threads", "a whole number of threads"),
        ("{spin: 3}", "spin", "true or false"),
        ("{providers: CUDAExecutionProvider}", "providers", "a list of execution provider names"),
    ],
)
def test_a_wrong_onnxruntime_option_is_a_graph_problem(tmp_path, options, field, fix):
    with pytest.raises(GraphError, match=rf"models\.relu\.options\.{field}: {field} is ") as exc:
        load_graph(_graph(tmp_path, options))
    assert fix in str(exc.value)


def test_valid_onnxruntime_options_load_and_run(tmp_path):
    options = "{optimization: basic, intra_op_threads: 1, inter_op_threads: 0, spin: false"
    options += ", providers: [CPUExecutionProvider]}"
    graph = load_graph(_graph(tmp_path, options))
    with Executor(graph) as ex:
        out = ex.infer_sync({"x": np.array([[-1.0, 0.0, 2.0]], np.float32)}, timeout_s=30).outputs["y"]
    assert out.tolist() == [[0.0, 0.0, 2.0]]
