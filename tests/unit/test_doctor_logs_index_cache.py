"""The learned layer's fitted index is kept on disk: the same answers, refitted when stale or broken."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from usg.doctor.logs import corpus, index_cache
from usg.doctor.logs.corpus import load_corpus
from usg.doctor.logs.similar import CaseIndex

TEXTS = [
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "failed to load 'det' version 1: Invalid argument: unexpected inference output 'y', allowed outputs are: z",
    "ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not recognize it",
    "onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] : 1 : FAIL : Load model failed",
]


def _answers(index: CaseIndex) -> list[tuple[object, float, list[str]]]:
    out = []
    for text in TEXTS:
        pred = index.predict(text)
        out.append((pred.root_cause, round(pred.confidence, 9), [n.case.url for n in index.nearest(text, 3)]))
    return out


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("USG_CACHE", str(tmp_path))
    return tmp_path / "doctor"


def test_a_stored_index_answers_like_a_fitted_one_and_a_broken_file_is_refitted(cache: Path) -> None:
    fitted = index_cache.cached_default_index()  # nothing stored yet: fits, then stores
    [stored] = cache.glob("logs-index-*.pkl")
    loaded = index_cache.cached_default_index()
    assert loaded is not fitted and len(loaded.cases) == len(load_corpus())
    assert _answers(loaded) == _answers(fitted)

    stored.write_bytes(stored.read_bytes()[:1000])  # cut off, as by a full disk
    refitted = index_cache.cached_default_index()
    assert _answers(refitted) == _answers(fitted)
    assert stored.stat().st_size > 1000  # replaced by a whole file
    assert not list(cache.glob(".logs-index-*.tmp"))


def test_the_key_follows_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = index_cache.index_key()
    copy = tmp_path / "corpus"
    shutil.copytree(corpus.CORPUS_DIR, copy)
    monkeypatch.setattr(corpus, "CORPUS_DIR", copy)
    assert index_cache.index_key() == before
    first = next(copy.glob("*.jsonl"))
    first.write_text(first.read_text().replace('"root_cause": "', '"root_cause":  "', 1))
    assert index_cache.index_key() != before


def test_a_cache_that_cannot_be_written_only_costs_the_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("USG_CACHE", str(blocked))  # cache_dir()/doctor cannot be created under a file
    index = index_cache.cached_default_index()
    assert len(index.cases) == len(load_corpus())
