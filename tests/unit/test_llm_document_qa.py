"""Optional node ports (``optional: [PORT]`` on a fn node) and the document_qa example's text-only path."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg import Executor, GraphError, load_graph

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "document_qa" / "graph.yaml"

PROMPT_ONLY = """
name: prompt-only
inputs:
  question: {modality: text}
  doc: {modality: text, optional: true}
cache: {backend: memory, max_bytes: 1000000}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {question: inputs.question, lines: inputs.doc}
    optional: [lines]
    cache: true
outputs:
  messages: prompt.messages
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "graph.yaml"
    path.write_text(text)
    return path


def test_an_optional_port_absent_runs_the_node_without_it(tmp_path: Path) -> None:
    graph = load_graph(_write(tmp_path, PROMPT_ONLY))
    with Executor(graph) as ex:
        alone = ex.infer_sync({"question": "q"})
        with_doc = ex.infer_sync({"question": "q", "doc": "TOTAL 42"})
        again = ex.infer_sync({"question": "q"})  # cached apart from the request with a doc
    assert alone.outputs["messages"] == [{"role": "user", "content": "q"}]
    assert with_doc.outputs["messages"][0]["content"].endswith("TOTAL 42\n\nq")
    assert again.outputs == alone.outputs


@pytest.mark.parametrize(
    ("node", "match"),
    [
        ("{model: m, inputs: {x: inputs.question}, optional: [x]}", "a model node's inputs cannot be optional"),
        ("{fn: usg.ops.llm:chat, inputs: {question: inputs.question}, optional: [lines]}", "'lines' is not one of"),
        ("{fn: usg.ops.llm:chat, inputs: {question: inputs.question}, optional: {a: 1}}", "write optional: \\[PORT"),
    ],
)
def test_bad_optional_is_a_graph_error(tmp_path: Path, node: str, match: str) -> None:
    text = f"""
name: bad
inputs: {{question: {{modality: text}}}}
models: {{m: {{backend: python, options: {{callable: "usg.ops.llm:chat"}}}}}}
nodes:
  n: {node}
outputs: {{o: n.messages}}
"""
    with pytest.raises(GraphError, match=match):
        load_graph(_write(tmp_path, text))


def test_document_qa_without_an_image_prunes_every_ocr_node(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    pytest.importorskip("uvicorn")
    from fake_openai import FakeEngine, RunningEngine

    with RunningEngine(FakeEngine()) as engine:
        monkeypatch.setenv("USG_LLM_URL", engine.url)
        monkeypatch.setenv("USG_LLM_MODEL", "tiny")
        with Executor(load_graph(EXAMPLE)) as ex:
            result = ex.infer_sync({"question": "What is the total?"})
    assert result.outputs == {"answer": "echo: Question: What is the total?"}
    ocr = {"det_pre", "det", "boxes", "crops", "cls_pre", "cls", "rec_pre", "rec", "lines"}
    assert set(result.pruned_nodes) == ocr
    (body,) = engine.bodies
    assert body["model"] == "tiny" and body["max_tokens"] == 256
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_an_unset_engine_variable_is_a_graph_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    monkeypatch.delenv("USG_LLM_URL", raising=False)
    monkeypatch.setenv("USG_LLM_MODEL", "tiny")
    ex = Executor(load_graph(EXAMPLE))
    try:
        with pytest.raises(
            GraphError, match=r"(?s)models.llm.options.url.*USG_LLM_URL, which is not set.*export USG_LLM_URL"
        ):
            ex.start_sync()
    finally:
        ex.close()
