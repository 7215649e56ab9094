"""Vision tokens per image, exactly as the HF processors count them."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg.errors import UsageError
from usg.plan import VisionShape, load_model_config

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"


def vision(name: str) -> VisionShape:
    v = load_model_config(RES / f"{name}.json").vision
    assert v is not None
    return v


def test_qwen2_vl_448_image_is_256_tokens() -> None:
    v = vision("qwen2-vl-2b-instruct")
    # 448/14 = 32 patches per side -> 1024 patches, merged 2x2 -> 256 tokens
    assert v.encoder_tokens((448, 448)) == 1024
    assert v.image_tokens((448, 448)) == 256


def test_qwen2_vl_smart_resize_rounding_and_limits() -> None:
    v = vision("qwen2-vl-2b-instruct")
    assert v.image_tokens((640, 480)) == (644 // 28) * (476 // 28)  # 23 x 17 = 391
    assert v.image_tokens((10, 10)) == 4  # raised to min_pixels 56x56
    assert v.image_tokens(None) == 16384  # worst case: max_pixels = 12845056
    with pytest.raises(UsageError, match=r"aspect ratio above 200"):
        v.image_tokens((10000, 10))


def test_llava_15_is_576_tokens_whatever_the_size() -> None:
    v = vision("llava-1.5-7b")
    assert v.image_tokens(None) == 576
    assert v.image_tokens((1920, 1080)) == 576
    assert v.encoder_tokens(None) == 577  # the CLS token is encoded, then dropped


def test_llava_next_anyres_tokens() -> None:
    v = vision("llava-v1.6-mistral-7b")
    assert v.image_tokens((672, 672)) == 2928  # 2x2 tiles: 48*48 + 48 newlines + 576 base
    assert v.image_tokens(None) == 2928  # the worst case over the grid pinpoints
    assert v.default_image_size() == (672, 672)
    assert v.image_tokens((336, 336)) < 2928
    assert v.encoder_tokens((672, 672)) == 5 * 577  # base + 4 tiles


def test_encoder_activation_scales_with_images() -> None:
    v = vision("qwen2-vl-2b-instruct")
    one = v.encoder_activation_bytes((448, 448), 1, 2.0)
    assert one == 2 * (1024 * (2 * 1280 + 5120) + 256 * 1536)
    assert v.encoder_activation_bytes((448, 448), 3, 2.0) == 3 * one


def test_non_positive_image_size() -> None:
    with pytest.raises(UsageError, match=r"image size 0x448 is not positive; fix: pass --image-size"):
        vision("llava-1.5-7b").image_tokens((0, 448))
