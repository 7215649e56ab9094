"""det's float32 input (usg.ops.ocr._det_input): computed in float32 (scale, shift) straight into the
channel-first input on reused memory, it matches RapidOCR's own float64 normalisation to float32
rounding, and bit for bit the four-pass float32 computation it replaced (convert, scale, shift,
transpose), also when earlier inputs are still alive and later ones reuse freed memory."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime")

from usg.ops.ocr import _det_input, _det_resizer


def page(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h + 7 * w).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("hw", [(263, 900), (300, 700), (31, 33), (1000, 300)])
def test_det_input_matches_rapidocr_normalisation(hw: tuple[int, int]) -> None:
    img = page(*hw)
    rapid = _det_resizer(736)(img)  # RapidOCR: resize, (x / 255 - mean) / std in float64, transpose, batch axis
    x = _det_input(img)
    assert x.dtype == np.float32 and x.flags["C_CONTIGUOUS"] and x.shape == rapid.shape
    assert np.abs(x - rapid).max() < 1e-6


def four_passes(img: np.ndarray) -> np.ndarray:
    x = _det_resizer(736).resize(img).astype(np.float32)
    x *= np.float32(2.0 / 255.0)
    x -= np.float32(1.0)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def test_det_input_is_bit_identical_to_the_four_pass_computation_on_reused_memory() -> None:
    pages = [page(h, w) for h, w in [(263, 900), (319, 900), (263, 900), (461, 900), (319, 900)]]
    kept = []
    for rnd in range(3):
        for i, img in enumerate(pages):
            x = _det_input(img)
            assert np.array_equal(x.view(np.uint32), four_passes(img).view(np.uint32))
            if rnd == 0 and i % 2 == 0:
                kept.append((img, x))  # alive while later inputs are made on freed memory
            del x
    for img, x in kept:
        assert np.array_equal(x.view(np.uint32), four_passes(img).view(np.uint32))
