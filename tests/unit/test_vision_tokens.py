"""usg.vision_tokens: image tokens from the published HF configs in tests/resources/hf, checked by hand
(and Qwen2-VL's resize against transformers' own ``smart_resize``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from usg.vision_tokens import ImageTokens, fuyu_tokens, image_tokens_from_configs, load_image_tokens

HF = Path(__file__).resolve().parents[1] / "resources" / "hf"


def _rule(name: str) -> ImageTokens:
    rule = load_image_tokens(HF / name)
    assert rule is not None
    return rule


def test_qwen2_vl_counts_follow_smart_resize() -> None:
    q = _rule("Qwen2-VL-2B-Instruct")
    # 448 is a multiple of 28: (448/14)² patches / 2² merge = 256, + vision start/end
    assert q.count(448, 448) == 258
    # 3000x4000 -> 2996x4004 (nearest multiples of 28, 11.99 M px <= max_pixels 12845056): 214·286/4 + 2
    assert q.count(3000, 4000) == 214 * 286 // 4 + 2 == 15303
    # any size: max_pixels / 28² + 2
    assert q.worst() == (12845056 // 784 + 2, None) == (16386, None)
    # within 1 M px and aspect 50 the worst is a thin image whose short side rounds up:
    # 154x6493 -> 168x6496 (6·28 x 232·28) = 12·464 / 4 + 2
    assert q.worst(1_000_000, 50) == (12 * 464 // 4 + 2, (154, 6493))


@pytest.mark.slow  # importing transformers' image processors takes seconds
def test_qwen2_vl_resize_agrees_with_transformers() -> None:
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from usg.vision_tokens import qwen2_vl_resize

    for h, w in [(448, 448), (3000, 4000), (17, 900), (1080, 1920), (5000, 5000)]:
        assert qwen2_vl_resize(h, w, 28, 3136, 12845056) == smart_resize(h, w, 28, 3136, 12845056)


def test_llava_is_one_tile_whatever_the_size() -> None:
    llava = _rule("llava-1.5-7b-hf")
    # (336/14)² = 576 patches + 1 CLS - 1 (strategy 'default')
    assert llava.count(480, 640) == llava.count(2000, 100) == llava.worst(40_000_000)[0] == 576


def test_llava_next_anyres_tiles() -> None:
    nxt = _rule("llava-v1.6-mistral-7b-hf")
    # 480x640 picks the 672x672 pinpoint: a 48x48 grid unpadded to 36 rows (640/480 is wider),
    # + 36 newlines + the 576-token base tile
    assert nxt.count(480, 640) == 36 * 48 + 36 + 576 == 2340
    # the largest: a full 672x672 grid: 48·48 + 48 + 576
    assert nxt.worst() == (2928, None)


def test_fuyu_rows_of_patches_and_newlines(tmp_path: Path) -> None:
    # adept/fuyu-8b's published fields (config.json, preprocessor_config.json)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "fuyu", "patch_size": 30, "image_size": 300}))
    pre = {"size": {"height": 1080, "width": 1920}, "patch_size": {"height": 30, "width": 30}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    fuyu = load_image_tokens(tmp_path)
    assert fuyu is not None and fuyu.family == "fuyu"
    assert fuyu.count(500, 700) == 17 * (24 + 1) + 1  # never upscaled: ceil(500/30) rows of ceil(700/30) + newline
    assert fuyu.count(2160, 1920) == 36 * (32 + 1) + 1  # scaled by 0.5 to 1080x960
    assert fuyu.worst() == (36 * (64 + 1) + 1, None) == (fuyu_tokens(1080, 1920, (30, 30), (1080, 1920)), None)


def test_paligemma_and_text_models() -> None:
    assert _rule("paligemma-3b-pt-224").count(1, 1) == 256
    assert image_tokens_from_configs({"model_type": "llama"}, {}) is None
