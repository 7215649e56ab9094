"""usg doctor GRAPH030: an LLM node's worst-case image + template + max_tokens against max_model_len,
from the published Qwen2-VL-2B configs in tests/resources/hf (no engine is contacted)."""

from __future__ import annotations

from pathlib import Path

from usg.doctor import run_doctor

QWEN = Path(__file__).resolve().parents[1] / "resources" / "hf" / "Qwen2-VL-2B-Instruct"

GRAPH = """
name: look
{limits}
inputs:
  question: {{modality: text}}
  image: {{modality: image{shape}}}
models:
  llm:
    backend: openai
    options: {{url: http://127.0.0.1:9, model: m, hf_model: '{hf}', max_tokens: 256{extra}}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question, image: inputs.image}}
    options: {{user: "Question: {{question}}"{vlm}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs: {{answer: answer.text}}
"""


def _doctor(tmp_path: Path, limits: str = "", shape: str = "", extra: str = ", max_model_len: 4096", vlm: str = ""):
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(limits=limits, shape=shape, hf=QWEN, extra=extra, vlm=vlm))
    return run_doctor([path]).findings


def test_the_largest_image_under_the_default_limits_cannot_fit(tmp_path: Path) -> None:
    (f,) = _doctor(tmp_path)
    assert f.code == "GRAPH030" and f.severity.value == "error"
    # limits.max_image_pixels 40 M > the processor's max_pixels 12845056: 12845056 / 28² + 2 = 16386 tokens;
    # "Question: " is 4 estimated tokens (10 bytes / 3) + 8 template tokens
    assert f.evidence["image_tokens"] == 16386 and f.evidence["template_tokens"] == 12
    assert "one image 16386 tokens" in f.message and "= 16654, above max_model_len 4096" in f.message
    # room for images: 4096 - 256 - 12 = 3828 tokens -> (3828 - 2) · 784 pixels
    assert f"max_pixels at {3826 * 784}" in f.fix and "--max-model-len 16654" in f.fix
    assert f.location.element == "nodes.answer" and f.location.line is not None


def test_no_finding_when_the_declared_images_fit(tmp_path: Path) -> None:
    # a fixed 448x448 input: 258 tokens
    assert _doctor(tmp_path, shape=", shape: [448, 448, 3]") == []
    # at most 1 M pixels: the worst is 1394 tokens (154x6493, see test_vision_tokens)
    assert _doctor(tmp_path, limits="limits: {max_image_pixels: 1000000}") == []
    # the context from hf_model's max_position_embeddings (32768) holds the largest image
    assert _doctor(tmp_path, extra="") == []
    # vlm: false sends no image
    assert _doctor(tmp_path, vlm=", vlm: false") == []


def test_a_tight_max_pixels_bound_names_max_tokens(tmp_path: Path) -> None:
    (f,) = _doctor(tmp_path, limits="limits: {max_image_pixels: 1000000}", extra=", max_model_len: 1500")
    # 1394 + 12 + 256 = 1662 > 1500: max_tokens 256 - 162 = 94 would fit
    assert "= 1662, above max_model_len 1500" in f.message and "lower options.max_tokens to 94" in f.fix


def test_a_fixed_count_family_is_not_told_to_send_smaller_images(tmp_path: Path) -> None:
    # LLaVA-1.5 takes (336/14)² = 576 tokens whatever the image size: a smaller image cannot help
    llava = QWEN.parent / "llava-1.5-7b-hf"
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(limits="", shape="", hf=llava, extra=", max_model_len: 700", vlm=""))
    (f,) = run_doctor([path]).findings
    assert f.code == "GRAPH030" and f.evidence["image_tokens"] == 576
    # 576 + 12 + 256 = 844 > 700: max_tokens 256 - 144 = 112 fits
    assert "smaller image" not in f.fix, f.fix
    assert "lower options.max_tokens to 112" in f.fix and "--max-model-len 844" in f.fix
