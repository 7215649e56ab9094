"""usg index / usg search command-line errors that need no model, and usg.index's curated API."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

if importlib.util.find_spec("faiss") is None:
    pytest.skip("usg[index] (faiss-cpu) is not installed", allow_module_level=True)

import usg.index
from usg.cli import cli
from usg.errors import UsageError


def test_index_all_is_sorted_and_exists() -> None:
    assert usg.index.__all__ == sorted(usg.index.__all__)
    assert all(hasattr(usg.index, n) for n in usg.index.__all__)


def run(*args: str) -> BaseException | None:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code != 0
    return r.exception


def test_build_refuses_folders_without_documents_and_non_index_outputs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.md").write_text("x")
    exc = run("index", "build", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert isinstance(exc, UsageError) and "holds no images or .txt files; fix:" in str(exc)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("precious")
    exc = run("index", "build", str(tmp_path / "empty"), "-o", str(tmp_path / "mine"), "--force")
    assert isinstance(exc, UsageError) and "is not a usg index; refusing to delete it" in str(exc)
    assert (tmp_path / "mine" / "keep.txt").is_file()


def test_search_and_remove_on_something_that_is_not_an_index(tmp_path: Path) -> None:
    exc = run("search", str(tmp_path), "hello")
    assert isinstance(exc, UsageError) and "is not a usg index (no manifest.json)" in str(exc)
    exc = run("index", "remove", str(tmp_path), "a.png")
    assert isinstance(exc, UsageError) and "fix: build one with `usg index build DIR -o" in str(exc)
    exc = run("search", str(tmp_path))
    assert isinstance(exc, UsageError) and "give a text query or --image PATH" in str(exc)
