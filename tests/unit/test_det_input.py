"""det's float32 input (usg.ops.ocr._det_input): a table of the 256 uint8 values applied to the
channel-first page gives the same float32 values, bit for bit, as converting, scaling, shifting
and transposing the whole page in float32 — and matches RapidOCR's own float64 normalisation to
float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime")

from usg.ops.ocr import _det_input, _det_resizer  # noqa: E402


def page(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h + 7 * w).integers(0, 256, (h, w, 3), dtype=np.uint8)


def four_passes(img: np.ndarray, limit: int = 736) -> np.ndarray:
    x = _det_resizer(limit).resize(img).astype(np.float32)
    x *= np.float32(2.0 / 255.0)
    x -= np.float32(1.0)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


@pytest.mark.parametrize("hw", [(263, 900), (736, 1440), (31, 33), (1000, 300)])
def test_det_input_equals_the_float32_formula_bit_for_bit(hw: tuple[int, int]) -> None:
    img = page(*hw)
    x = _det_input(img)
    ref = four_passes(img)
    assert x.dtype == np.float32 and x.flags["C_CONTIGUOUS"] and x.shape == ref.shape
    assert np.array_equal(x.view(np.uint32), ref.view(np.uint32))


def test_det_input_matches_rapidocr_normalisation() -> None:
    img = page(300, 700)
    pre = _det_resizer(736)
    rapid = pre(img)  # RapidOCR: resize, (x / 255 - mean) / std in float64, transpose, add batch axis
    x = _det_input(img)
    assert x.shape == rapid.shape
    assert np.abs(x - rapid).max() < 1e-6
