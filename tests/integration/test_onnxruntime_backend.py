"""The ONNX Runtime backend on a real model: specs read from the file, providers chosen and logged."""

import logging

import numpy as np
import pytest

from usg.backends import OnnxRuntimeBackend
from usg.errors import BackendError, StateError
from usg.graph.paths import resolve_path

CLS = "pkg://rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_specs_providers_and_threads_are_logged(caplog):
    b = OnnxRuntimeBackend(resolve_path(CLS, None), {"intra_op_threads": 1}, name="cls")
    spec = b.input_specs["x"]
    assert spec.dtype == "float32" and spec.shape == (None, 3, None, None)
    with pytest.raises(StateError, match="call load\\(\\) before infer\\(\\)"):
        b.infer({"x": np.zeros((1, 3, 48, 192), np.float32)})
    with caplog.at_level(logging.INFO, logger="usg.backends.onnxruntime"):
        b.load()
    assert b.providers[-1] == "CPUExecutionProvider"
    assert "model cls: ch_ppocr_mobile_v2.0_cls_infer.onnx on CPUExecutionProvider (intra-op threads 1)" in caplog.text
    out = b.infer({"x": np.zeros((2, 3, 48, 192), np.float32)})
    (probs,) = out.values()
    assert probs.shape == (2, 2)
    with pytest.raises(BackendError, match=r"model 'cls' failed on inputs \{'x': 'float32\[1, 4, 48, 192\]'\}"):
        b.infer({"x": np.zeros((1, 4, 48, 192), np.float32)})
    b.close()
