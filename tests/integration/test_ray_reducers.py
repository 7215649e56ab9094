"""Ray transport reducers on the bundled document graph: det's boxes and rec's best path are read
on the model's replica and equal what the full output gives (the example graph's models, MiniLM
exported into the cache included, must load: an integration test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "document_ocr" / "graph.yaml"


def test_rec_output_is_reduced_on_its_replica_only_where_every_reader_declares_it() -> None:
    import dataclasses

    from usg.graph import load_graph
    from usg.graph.model import Ref
    from usg.ops.ocr import ctc_decode
    from usg.ops.wire import best_path
    from usg.scale.transport import Reducer, output_reducers

    g = load_graph(EXAMPLE, export_missing=True)
    assert output_reducers(g) == {
        "det": {"out": Reducer("usg.ops.ocr_db:det_candidates")},
        "rec": {"out": Reducer("usg.ops.wire:best_path")},
    }
    exported = dataclasses.replace(g, outputs={**g.outputs, "probs": Ref("rec", "out")})
    assert "rec" not in output_reducers(exported)  # a graph output keeps its full value
    probs = np.random.default_rng(1).random((1, 12, 40), dtype=np.float32)
    box = np.array([[0, 0], [10, 0], [10, 5], [0, 5]], np.float32)
    meta = {"ops": [], "raw_shape": (100, 100)}
    vocab = "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
    full = ctc_decode([probs], [box], meta, vocab_model=vocab, text_score=0.0)
    reduced = ctc_decode([best_path(probs)], [box], meta, vocab_model=vocab, text_score=0.0)
    assert full == reduced and full["lines"]


def _probability_map() -> np.ndarray:
    """A DB-like map: a few text-line blobs of varied strength (one below box_thresh) and speckle."""
    rng = np.random.default_rng(3)
    prob = rng.random((1, 1, 160, 320), dtype=np.float32) * 0.2
    for y, x, h, w, v in (
        (10, 12, 14, 150, 0.9),
        (40, 30, 10, 220, 0.7),
        (70, 5, 18, 90, 0.45),
        (100, 200, 8, 60, 0.95),
    ):
        prob[0, 0, y : y + h, x : x + w] = v
    prob[0, 0, 130:133, 40:43] = 0.99  # too small to be a box
    return prob


def test_det_boxes_are_read_on_the_replica_exactly_as_rapidocr_reads_the_whole_map() -> None:
    import dataclasses
    import pickle

    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    from usg.graph import load_graph
    from usg.ops.ocr import det_postprocess
    from usg.ops.ocr_db import det_candidates, scale_candidates
    from usg.scale.transport import Reducer, output_reducers, payload_bytes

    prob = _probability_map()
    for box_thresh, unclip in ((0.5, 1.6), (0.3, 2.0)):
        post = DBPostProcess(0.3, box_thresh, 1000, unclip, "fast", use_dilation=True)
        expected, _ = post(prob, (461, 900))
        found = det_candidates(prob, box_thresh=box_thresh, unclip_ratio=unclip)
        got = scale_candidates(pickle.loads(pickle.dumps(found)), (461, 900))
        assert len(got) == len(expected) >= 2 and all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
        assert payload_bytes(found) < 1024 < prob.nbytes  # boxes cross, not the map
        meta = {"image": np.zeros((461, 900, 3), np.uint8)}
        opts = {"box_thresh": box_thresh, "unclip_ratio": unclip}
        full, reduced = det_postprocess(prob, meta, **opts)["boxes"], det_postprocess(found, meta, **opts)["boxes"]
        assert [b.tolist() for b in full] == [b.tolist() for b in reduced]
    assert len(det_candidates(prob, box_thresh=0.3).boxes) > len(det_candidates(prob).boxes)  # the option matters
    # the replica reads det's map with the reading node's options
    g = load_graph(EXAMPLE, export_missing=True)
    node = dataclasses.replace(g.nodes["boxes"], options={"box_thresh": 0.4})
    tuned = dataclasses.replace(g, nodes={**g.nodes, "boxes": node})
    assert output_reducers(tuned)["det"] == {"out": Reducer("usg.ops.ocr_db:det_candidates", {"box_thresh": 0.4})}
