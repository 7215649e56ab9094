"""usg export triton on the real example graph (PP-OCR + MiniLM) and on a text-only graph of its models:
the doctor finds no errors, every config.pbtxt parses with Triton's schema and matches its ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from usg.cli import main
from usg.doctor import Severity, run_doctor
from usg.doctor.triton.config import DTYPE_TO_ONNX
from usg.doctor.triton.crosscheck import onnx_io
from usg.export.triton import BLS, export_triton
from usg.graph import Graph, GraphBuilder, load_graph

pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def parse(path: Path) -> Any:
    from google.protobuf import text_format

    config = pb2.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def assert_matches_onnx(config: Any, model_file: Path) -> None:
    """Names, dtypes and shapes of the config equal the ONNX file's (batch dim added back when batching)."""
    ins, outs = onnx_io(onnx.load(str(model_file), load_external_data=False))
    mbs = int(config.max_batch_size)
    for declared, actual in ((config.input, ins), (config.output, outs)):
        assert {t.name for t in declared} == set(actual)
        for t in declared:
            assert DTYPE_TO_ONNX[pb2.DataType.Name(t.data_type)] == actual[t.name].dtype
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            assert ([-1, *dims] if mbs > 0 else dims) == actual[t.name].dims, t.name


@pytest.fixture(scope="module")
def graph(example_graph_path: Path) -> Graph:
    return load_graph(example_graph_path, export_missing=True)


@pytest.mark.parametrize("onnx_via", ["onnxruntime", "python"])
def test_example_graph_exports_to_a_repository_the_doctor_passes(graph: Graph, tmp_path: Path, onnx_via: str) -> None:
    result = export_triton(graph, tmp_path, onnx_via=onnx_via)
    assert result.mode == BLS and "input 'image' is optional" in result.reasons[0]
    report = run_doctor([tmp_path])
    assert [f for f in report.findings if f.severity is not Severity.INFO] == []
    configs = {p.parent.name: parse(p) for p in tmp_path.glob("*/config.pbtxt")}
    assert set(configs) == {"det", "cls", "rec", "tokenizer", "minilm", "document-ocr"}
    for name in ("det", "cls", "rec", "minilm"):
        assert configs[name].max_batch_size == max(1, graph.models[name].batch.max_size)
        assert_matches_onnx(configs[name], tmp_path / name / "1" / "model.onnx")
        runtime = configs[name].platform or configs[name].backend
        assert runtime == ("onnxruntime_onnx" if onnx_via == "onnxruntime" else "python")
    assert [(g.count, g.kind) for g in configs["det"].instance_group] == [(2, pb2.ModelInstanceGroup.KIND_CPU)]
    bls = configs["document-ocr"]
    assert {t.name: (pb2.DataType.Name(t.data_type), t.optional) for t in bls.input} == {
        "image": ("TYPE_STRING", True),
        "text": ("TYPE_STRING", True),
    }
    copy = load_graph(tmp_path / "document-ocr" / "1" / "graph.yaml")
    assert copy.order == graph.order
    assert all(copy.models[m].path.is_relative_to(tmp_path.resolve()) for m in copy.models)


def test_text_only_graph_of_the_example_models_is_an_ensemble(graph: Graph, tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "text.yaml"
    path.write_text(
        "name: query\n"
        "inputs: {text: {modality: text}}\n"
        "models:\n"
        f"  tok: {{backend: tokenizer, path: '{graph.models['tokenizer'].path}'}}\n"
        f"  enc: {{backend: onnxruntime, path: '{graph.models['minilm'].path}', batch: {{max_size: 16}}}}\n"
        "nodes:\n"
        "  tok: {model: tok, inputs: {text: inputs.text}}\n"
        "  enc: {model: enc, inputs: {input_ids: tok.input_ids, attention_mask: tok.attention_mask,"
        " token_type_ids: tok.token_type_ids}}\n"
        "outputs: {embedding: enc.embedding}\n"
    )
    out = tmp_path / "repo"
    assert main(["export", "triton", str(path), str(out)]) is None
    printed = capsys.readouterr().out
    assert "a Triton ensemble" in printed and "0 error(s), 0 warning(s)" in printed
    ens = parse(out / "query" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["tok", "enc"]
    assert_matches_onnx(parse(out / "enc" / "config.pbtxt"), out / "enc" / "1" / "model.onnx")
    tok = parse(out / "tok" / "config.pbtxt")
    assert (tok.backend, tok.max_batch_size) == ("python", 1)
    assert (out / "tok" / "1" / "tokenizer.json").is_file()


def test_builder_graph_with_a_python_model_keeps_it_inside_the_bls_model(graph: Graph, tmp_path: Path) -> None:
    g = (
        GraphBuilder("mixed")
        .input("text", "text", optional=True)
        .model("tok", "tokenizer", path=graph.models["tokenizer"].path)
        .model("echo", "python", options={"callable": "testops:identity"})
        .node("tok", model="tok", inputs={"text": "inputs.text"})
        .node("echo", model="echo", inputs={"x": "tok.input_ids"})
        .output("ids", "echo.y")
        .build()
    )
    result = export_triton(g, tmp_path)
    assert result.mode == BLS and [m.name for m in result.models] == ["tok", "mixed"]
    assert "model 'echo' (backend python) declares no tensor dtypes/shapes" in result.reasons
    doc = (tmp_path / "mixed" / "1" / "graph.yaml").read_text()
    assert "callable: testops:identity" in doc and (tmp_path / "mixed" / "1" / "testops.py").is_file()
    assert run_doctor([tmp_path]).errors == 0
