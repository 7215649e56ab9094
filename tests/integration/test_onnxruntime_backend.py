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


def test_a_single_threaded_cpu_session_reports_its_calls_cpu_time_to_the_batch_controller():
    import asyncio

    from usg.graph import BatchPolicy
    from usg.runtime.batcher import controlled
    from usg.runtime.kernel import BatchKernel

    one = OnnxRuntimeBackend(resolve_path(CLS, None), {"intra_op_threads": 1}, name="cls")
    two = OnnxRuntimeBackend(resolve_path(CLS, None), {"intra_op_threads": 2}, name="cls")
    unset = OnnxRuntimeBackend(resolve_path(CLS, None), {}, name="cls")
    for b in (one, two, unset):
        b.load()
    # ORT runs every op in the calling thread only with one intra-op thread
    assert (one.cpu_in_caller, two.cpu_in_caller, unset.cpu_in_caller) == (True, False, False)
    assert controlled(BatchPolicy(max_size=8), one) and not controlled(BatchPolicy(max_size=8), two)
    events = []
    item = {"x": np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)}
    asyncio.run(
        BatchKernel("cls", one, None).run([item] * 4, [0.0] * 4, lambda *a: None, lambda e, i: events.append(e))
    )
    (event,) = events
    assert event.items == 4 and event.cpu_ms is not None and event.cpu_ms > 0
    for b in (one, two, unset):
        b.close()
