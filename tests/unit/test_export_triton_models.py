"""The exported Python-backend models (model.py → usg.export.triton) run in a stand-in for Triton
(tests/resources/triton_server/fake_triton.py): the BLS graph model answers like the in-process executor,
USG backends batch requests of one shape, errors become per-request Triton errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from usg.export.triton import export_triton
from usg.graph import BatchPolicy, Graph, GraphBuilder
from usg.runtime import Executor
from usg.specs import TensorSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "triton_server"))

import fake_triton as ft

pytest.importorskip("tritonclient.grpc.model_config_pb2")


def vec_onnx(path: Path) -> Path:
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["n", "k"])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["n", "k"])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def word_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, "total": 2, "due": 3, "now": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture()
def graph(tmp_path: Path) -> Graph:
    return (
        GraphBuilder("g")
        .input("text", "text", optional=True)
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)), optional=True)
        .model("tok", "tokenizer", path=word_tokenizer(tmp_path / "tokenizer.json"))
        .model("neg", path=vec_onnx(tmp_path / "neg.onnx"), batch=BatchPolicy(max_size=4))
        .node("tok", model="tok", inputs={"text": "inputs.text"})
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 3})
        .node("neg", model="neg", map=True, inputs={"x": "split.items"})
        .output("ids", "tok.input_ids")
        .output("shout", "up.text")
        .output("negs", "neg.y")
        .build()
    )


@pytest.fixture()
def repo(graph: Graph, tmp_path: Path) -> Iterator[Path]:
    export_triton(graph, tmp_path / "repo", onnx_via="python")
    ft.load_repository(tmp_path / "repo")
    yield tmp_path / "repo"
    ft.unload()


def bls(inputs: dict[str, Any]) -> ft.InferenceResponse:
    tensors = [
        ft.Tensor(k, np.array([v.encode()], dtype=object) if isinstance(v, str) else v) for k, v in inputs.items()
    ]
    return ft.send("g", tensors)


def outputs(response: ft.InferenceResponse) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error().message()  # type: ignore[union-attr]
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def test_bls_graph_model_answers_like_the_in_process_executor(repo: Path, graph: Graph) -> None:
    with Executor(graph) as ex:
        want_text = ex.infer_sync({"text": "total due now"}).outputs
        x = np.arange(4, dtype=np.float32)[None]
        want_x = ex.infer_sync({"x": x}).outputs
    got = outputs(bls({"text": "total due now"}))
    assert set(got) == {"ids", "shout"}  # the x branch is pruned: its output is absent
    np.testing.assert_array_equal(got["ids"], want_text["ids"])
    assert got["shout"].tolist() == [b"TOTAL DUE NOW"]
    got = outputs(bls({"x": x}))
    assert set(got) == {"negs"}
    assert [json.loads(v) for v in got["negs"]] == [a.tolist() for a in want_x["negs"]]


def test_bls_errors_are_per_request_triton_errors_with_the_usg_message(repo: Path) -> None:
    response = bls({"x": np.zeros((1, 4), dtype=np.int64)})
    error = response.error()
    assert error is not None and error.code == ft.TritonError.INVALID_ARG
    assert "x: int64[1, 4] does not match float32 [1,?]" in error.message() and "fix:" in error.message()


def test_onnx_model_concatenates_requests_of_one_shape(repo: Path) -> None:
    model, _ = ft.MODELS["neg"]
    calls: list[int] = []
    infer = model.backend.infer
    model.backend.infer = lambda inputs: calls.append(len(inputs["x"])) or infer(inputs)
    a, b, c = (np.full((1, 2), 1, np.float32), np.full((2, 2), 2, np.float32), np.full((1, 3), 3, np.float32))
    responses = model.execute([ft.Request([ft.Tensor("x", v)]) for v in (a, b, c)])
    assert sorted(calls) == [1, 3]  # a and b share a call; c has another shape
    for r, v in zip(responses, (a, b, c), strict=True):
        np.testing.assert_array_equal(outputs(r)["y"], -v)


def test_tokenizer_model_reads_the_item_axis_text(repo: Path) -> None:
    got = outputs(ft.send("tok", [ft.Tensor("text", np.array([[b"total due"]], dtype=object))]))
    assert got["input_ids"].tolist() == [[2, 3]]


def test_an_ensemble_step_that_returns_nothing_fails_with_the_fix(tmp_path: Path, monkeypatch: Any) -> None:
    from usg.export.triton.python_models import FnNodeModel

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", ft)
    config = {
        "name": "nothing",
        "input": [{"name": "text", "data_type": "TYPE_STRING"}],
        "output": [{"name": "text", "data_type": "TYPE_STRING"}],
        "parameters": {"usg_fn": {"string_value": "testops:nothing"}, "usg_text_inputs": {"string_value": '["text"]'}},
    }
    model = FnNodeModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"})
    [response] = model.execute([ft.Request([ft.Tensor("text", np.array([b"hi"], dtype=object))])])
    error = response.error()
    assert error is not None
    assert "fn testops:nothing returned no value for ['text']" in error.message()
    assert "fix: return a value, or export the graph as a BLS model" in error.message()
