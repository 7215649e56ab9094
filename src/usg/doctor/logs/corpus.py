"""The labelled corpus of real error messages that ``usg doctor logs`` learns unseen phrasings from.

Each entry is an excerpt a user pasted in a public issue thread, verbatim, with the thread's URL,
the engine/project it comes from, the root-cause class and the resolution the thread reports
(``resolution_confirmed`` says whether the thread confirms it). One JSON-lines file per project
lives next to this module (``corpus/*.jsonl``); ``corpus/PROVENANCE.md`` says how it was built.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from usg.doctor.findings import RootCause

__all__ = ["CORPUS_DIR", "LabelledCase", "load_corpus", "thread_key"]

CORPUS_DIR = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class LabelledCase:
    url: str
    project: str
    root_cause: RootCause
    resolution: str
    resolution_confirmed: bool
    excerpt: str

    @property
    def thread(self) -> str:
        return thread_key(self.url)


def thread_key(url: str) -> str:
    """``https://github.com/o/r/issues/12`` -> ``o/r#12`` (the held-out list's notation)."""
    parts = url.rstrip("/").split("/")
    return f"{parts[3]}/{parts[4]}#{parts[6]}" if len(parts) >= 7 else url


@cache
def _load_all(directory: Path) -> tuple[LabelledCase, ...]:
    cases = []
    for path in sorted(directory.glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                cases.append(
                    LabelledCase(
                        url=row["url"],
                        project=row["project"],
                        root_cause=RootCause(row["root_cause"]),
                        resolution=row["resolution"],
                        resolution_confirmed=bool(row["resolution_confirmed"]),
                        excerpt=row["excerpt"],
                    )
                )
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path.name}:{n}: bad corpus entry ({exc}); fix: see corpus/PROVENANCE.md") from exc
    return tuple(cases)


def load_corpus(exclude_projects: Iterable[str] = (), directory: Path | None = None) -> list[LabelledCase]:
    """Every labelled case, without those of ``exclude_projects`` (leave-one-project-out)."""
    skip = set(exclude_projects)
    return [c for c in _load_all(directory or CORPUS_DIR) if c.project not in skip]
