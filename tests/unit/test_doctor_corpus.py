"""The labelled corpus behind `usg doctor logs`' learned layer: well-formed, large enough, no held-out thread."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from usg.doctor.findings import RootCause
from usg.doctor.logs.corpus import CORPUS_DIR, load_corpus, thread_key

# the held-out list lives in the team's shared/ folder beside the checkout (never copied into the repo);
# a git worktree sits one level deeper (wt/NAME) than the main checkout
_HERE = Path(__file__).resolve()
_CANDIDATES = [_HERE.parents[i] / "shared" / "heldout-threads.txt" for i in (3, 4)]
SHARED_HELDOUT = next((p for p in _CANDIDATES if p.is_file()), _CANDIDATES[0])


def _heldout() -> set[str]:
    if not SHARED_HELDOUT.is_file():
        pytest.skip(f"the held-out thread list is not beside this checkout (looked at {_CANDIDATES})")
    lines = SHARED_HELDOUT.read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def test_corpus_is_large_and_spans_projects() -> None:
    cases = load_corpus()
    assert len(cases) >= 250
    assert len({c.project for c in cases}) >= 10
    assert len({c.root_cause for c in cases}) >= 8


def test_no_held_out_thread_is_used() -> None:
    heldout = _heldout()
    assert len(heldout) > 50
    used = {thread_key(c.url) for c in load_corpus()}
    assert sorted(used & heldout) == []


def test_every_entry_is_complete() -> None:
    for path in sorted(CORPUS_DIR.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            assert set(row) == {"url", "project", "root_cause", "resolution", "resolution_confirmed", "excerpt"}
            assert row["url"].startswith("https://github.com/") and row["project"] == path.stem
            assert RootCause(row["root_cause"]) is not RootCause.UNCLASSIFIED
            assert row["excerpt"].strip() and row["resolution"].strip()


def test_no_excerpt_is_entered_twice() -> None:
    seen = collections.Counter((c.url, c.excerpt) for c in load_corpus())
    assert [k for k, n in seen.items() if n > 1] == []
