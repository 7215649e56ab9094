"""backend: openai against a fake OpenAI-compatible engine: image-token budgets from HF configs,
``endpoint: completions``, and what ``vlm`` puts into the request body the engine receives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from fake_openai import FakeEngine, RunningEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from usg import Executor, GraphError, InputError, PayloadTooLarge, load_graph
from usg.backends.llm_budget import data_url_size
from usg.ops.llm import image_data_url

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "tests" / "resources" / "hf" / "Qwen2-VL-2B-Instruct"


class CompletionsEngine(FakeEngine):
    """The fake engine plus ``POST /v1/completions`` (echoes the prompt)."""

    async def _complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        return JSONResponse({"choices": [{"index": 0, "text": f"echo: {body['prompt']}", "finish_reason": "stop"}]})

    def app(self) -> Starlette:
        app = super().app()
        app.router.routes.append(Route("/v1/completions", self._complete, methods=["POST"]))
        return app


VISION = """
name: look
inputs:
  question: {{modality: text}}
  image: {{modality: image}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', max_model_len: 2048, max_tokens: 64, hf_model: '{hf}'}}
nodes:
  prompt: {{fn: usg.ops.llm:chat, inputs: {{question: inputs.question, image: inputs.image}}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs: {{answer: answer.text}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "graph.yaml"
    path.write_text(text)
    return path


def test_image_tokens_from_the_qwen2_vl_configs_refuse_before_sending(tmp_path: Path) -> None:
    with RunningEngine(FakeEngine()) as engine:
        graph = load_graph(_write(tmp_path, VISION.format(url=engine.url, hf=QWEN)))
        with Executor(graph) as ex:
            # 1000x1000 -> 1008x1008: (72·72)/4 + 2 = 1298 image tokens; fits 2048 with max_tokens 64
            fits = ex.infer_sync({"question": "what?", "image": np.zeros((1000, 1000, 3), np.uint8)})
            assert fits.outputs["answer"] == "echo: what?"
            # 2000x2000 -> 1988x1988: (142·142)/4 + 2 = 5043 image tokens
            too_big = r"1 image\(s\) 5043 tokens \[5043 \(2000x2000\); Qwen2-VL.*max_tokens 64 = \d+, above.*2048"
            with pytest.raises(PayloadTooLarge, match=too_big) as info:
                ex.infer_sync({"question": "what?", "image": np.zeros((2000, 2000, 3), np.uint8)})
    assert info.value.status == 413
    assert "send fewer or smaller images" in str(info.value.fix) and "max_pixels" in str(info.value.fix)
    assert len(engine.bodies) == 1  # only the request that fits reached the engine


def test_without_max_model_len_the_hf_config_context_is_the_limit(tmp_path: Path) -> None:
    # the engine reports no max_model_len (as transformers serve does): Qwen2-VL-2B's max_position_embeddings
    text = VISION.replace("max_model_len: 2048, max_tokens: 64", "max_tokens: 30000")
    with RunningEngine(FakeEngine(models=[{"id": "tiny"}])) as engine:
        graph = load_graph(_write(tmp_path, text.format(url=engine.url, hf=QWEN)))
        limit = r"5043 tokens.*max_tokens 30000 = \d+, above max_position_embeddings of options.hf_model.* 32768"
        with Executor(graph) as ex, pytest.raises(PayloadTooLarge, match=limit):
            ex.infer_sync({"question": "what?", "image": np.zeros((2000, 2000, 3), np.uint8)})
    assert engine.bodies == []


def test_data_url_size_reads_the_header() -> None:
    url = image_data_url(np.zeros((7, 11, 3), np.uint8))
    assert data_url_size(url) == (7, 11)
    assert data_url_size("https://example.com/cat.png") is None
    assert data_url_size("data:image/png;base64,bm90IGFuIGltYWdl") is None


def test_a_bad_hf_model_is_a_graph_error_naming_the_option(tmp_path: Path) -> None:
    graph = load_graph(_write(tmp_path, VISION.format(url="http://127.0.0.1:9", hf=tmp_path / "nowhere")))
    with pytest.raises(GraphError, match=r"(?s)models\.llm\.options\.hf_model.*cannot read"), Executor(graph):
        pass


COMPLETE = """
name: complete
inputs: {{question: {{modality: text}}}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', endpoint: {endpoint}, max_tokens: 17, max_model_len: 64}}
nodes:
  prompt: {{fn: {fn}, inputs: {{question: inputs.question}}, options: {options}}}
  answer: {{model: llm, inputs: {{messages: prompt.{port}}}}}
outputs: {{answer: answer.text}}
"""


def _complete_graph(tmp_path: Path, url: str, **kw: str) -> Path:
    fields = {"endpoint": "completions", "fn": "usg.ops.llm:complete", "port": "prompt"}
    fields["options"] = '{template: "Q: {question}\\nA:"}'
    return _write(tmp_path, COMPLETE.format(url=url, **{**fields, **kw}))


def test_completions_send_the_prompt_as_it_is(tmp_path: Path) -> None:
    with (
        RunningEngine(CompletionsEngine()) as engine,
        Executor(load_graph(_complete_graph(tmp_path, engine.url))) as ex,
    ):
        out = ex.infer_sync({"question": "2+2?"}).outputs
        with pytest.raises(PayloadTooLarge, match=r"prompt \d+ text tokens.*max_tokens 17 = \d+, above.*64"):
            ex.infer_sync({"question": "word " * 60})
    assert out == {"answer": "echo: Q: 2+2?\nA:"}
    # engine_stream auto (the default) and a caller that does not stream: one whole completion is asked for
    assert engine.bodies == [{"model": "tiny", "prompt": "Q: 2+2?\nA:", "max_tokens": 17}]


def test_chat_messages_to_a_completions_model_say_what_to_wire(tmp_path: Path) -> None:
    path = _complete_graph(tmp_path, "http://127.0.0.1:9", fn="usg.ops.llm:chat", port="messages", options="{}")
    text = path.read_text().replace("max_model_len: 64", "max_model_len: 64, model: tiny")
    bad = r"endpoint: completions.*got chat messages.*usg.ops.llm:complete"
    with Executor(load_graph(_write(tmp_path, text))) as ex, pytest.raises(InputError, match=bad):
        ex.infer_sync({"question": "q"})


def test_unknown_endpoint_names_the_choices(tmp_path: Path) -> None:
    graph = load_graph(_complete_graph(tmp_path, "http://127.0.0.1:9", endpoint="chatt"))
    bad = r"(?s)models\.llm\.options\.endpoint.*'chatt'.*endpoint: completions"
    with pytest.raises(GraphError, match=bad), Executor(graph):
        pass


def _user_content(body: dict[str, Any]) -> Any:
    (system, user) = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    return user["content"]


@pytest.mark.slow
def test_document_qa_vlm_puts_the_image_next_to_its_ocr_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from PIL import Image

    example = ROOT / "examples" / "document_qa" / "graph.yaml"
    sample = ROOT / "examples" / "document_ocr" / "sample.png"
    text = example.read_text()
    assert "options:\n  vlm: false" in text
    vlm = _write(tmp_path, text.replace("options:\n  vlm: false", "options:\n  vlm: true"))
    with RunningEngine(FakeEngine()) as engine:
        monkeypatch.setenv("USG_LLM_URL", engine.url)
        monkeypatch.setenv("USG_LLM_MODEL", "tiny")
        with Executor(load_graph(example)) as ex:
            plain = ex.infer_sync({"question": "What is the total?", "image": sample})
        with Executor(load_graph(vlm)) as ex:
            seen = ex.infer_sync({"question": "What is the total?", "image": sample})
    lines = "\n".join(line["text"] for line in plain.outputs["lines"])
    expected_text = f"Text read from the document, one line each:\n{lines}\n\nQuestion: What is the total?"
    without, with_image = engine.bodies
    assert _user_content(without) == expected_text  # vlm: false -> only the OCR lines
    url = image_data_url(np.asarray(Image.open(sample).convert("RGB")))
    assert _user_content(with_image) == [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": expected_text},
    ]
    assert without["messages"][0] == with_image["messages"][0] and without["max_tokens"] == 256
    assert seen.outputs["lines"] == plain.outputs["lines"]


GRAPH_OPTIONS = """
name: opts
options: {vlm: false, system: "from the graph"}
inputs:
  question: {modality: text}
  image: {modality: image}
nodes:
  a: {fn: usg.ops.llm:chat, inputs: {question: inputs.question, image: inputs.image}}
  b: {fn: usg.ops.llm:chat, inputs: {question: inputs.question, image: inputs.image}, options: {vlm: true}}
outputs: {a: a.messages, b: b.messages}
"""


def test_graph_options_are_defaults_of_every_fn_node(tmp_path: Path) -> None:
    with Executor(load_graph(_write(tmp_path, GRAPH_OPTIONS))) as ex:
        out = ex.infer_sync({"question": "q", "image": np.zeros((4, 4, 3), np.uint8)}).outputs
    assert out["a"] == [{"role": "system", "content": "from the graph"}, {"role": "user", "content": "q"}]
    assert [p["type"] for p in out["b"][1]["content"]] == ["image_url", "text"]  # the node's own vlm wins


def test_graph_options_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match=r"(?s)options.*write options: \{KEY: VALUE\}"):
        load_graph(
            _write(tmp_path, GRAPH_OPTIONS.replace('options: {vlm: false, system: "from the graph"}', "options: [1]"))
        )
