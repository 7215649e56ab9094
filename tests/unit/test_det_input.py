"""det's float32 input (usg.ops.ocr._det_input): computed in float32 in four passes (convert, scale,
shift, transpose), it matches RapidOCR's own float64 normalisation to float32 rounding."""

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
