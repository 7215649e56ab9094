"""How does `usg doctor logs` do on threads it was never tuned on? Corpus entries added between two commits.

Leave-one-project-out (benchmarks/log_classifier.py) reuses the corpus the rules were written from, so
its rule rows are optimistic. This script measures the classifier on entries that entered the corpus
between ``--before`` and ``--after`` (git revisions of this repository): collected after the code
under test was written and not read while writing it. The learned layer is fitted on the corpus at
``--index-rev`` (default ``--before``) and uses the code's shipped calibration; the entries measured
are never in that index. The code measured is the ``usg`` on the import path, so the same script runs
against an older checkout:

    PYTHONPATH=<checkout of REV>/src python benchmarks/log_classifier_unseen.py --before A --after B

Run: python benchmarks/log_classifier_unseen.py --before REV --after REV [--index-rev REV] [--details]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
from pathlib import Path

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase, thread_key
from usg.doctor.logs.similar import CaseIndex

CORPUS = "src/usg/doctor/logs/corpus"
ROOT = Path(__file__).resolve().parents[1]


def corpus_at(rev: str) -> list[LabelledCase]:
    """The labelled corpus as committed at ``rev``."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    cases = []
    for name in git("ls-tree", "--name-only", f"{rev}:{CORPUS}").split():
        if not name.endswith(".jsonl"):
            continue
        for line in git("show", f"{rev}:{CORPUS}/{name}").splitlines():
            if line.strip():
                row = json.loads(line)
                cases.append(
                    LabelledCase(
                        row["url"],
                        row["project"],
                        RootCause(row["root_cause"]),
                        row["resolution"],
                        bool(row["resolution_confirmed"]),
                        row["excerpt"],
                    )
                )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="revision whose corpus the new entries were not in")
    parser.add_argument("--after", required=True, help="revision whose corpus has them")
    parser.add_argument("--index-rev", help="corpus the learned layer learns from (default: --before)")
    parser.add_argument("--details", action="store_true", help="list every entry not classified correctly")
    args = parser.parse_args()
    old = {(c.url, c.excerpt) for c in corpus_at(args.before)}
    new = [c for c in corpus_at(args.after) if (c.url, c.excerpt) not in old]
    measured = {c.thread for c in new}
    index_cases = [c for c in corpus_at(args.index_rev or args.before) if c.thread not in measured]
    index = CaseIndex(index_cases)
    print(f"{len(new)} entries added between {args.before} and {args.after}; index: {len(index_cases)} cases")
    total: collections.Counter[str] = collections.Counter()
    per_project: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case in new:
        root = root_error(classify_text(case.excerpt, "<unseen>", index=index))
        got = root.root_cause if root is not None and root.root_cause is not RootCause.UNCLASSIFIED else None
        outcome = "unclassified" if got is None else ("right" if got is case.root_cause else "wrong")
        total[outcome] += 1
        per_project[case.project][outcome] += 1
        if args.details and outcome != "right":
            code = root.code if root is not None else "-"
            print(
                f"    {outcome:<12} {case.root_cause.value:>20} -> {got.value if got else '-':<20} {code} "
                f"{thread_key(case.url)}"
            )

    def row(name: str, c: collections.Counter[str]) -> str:
        n = max(sum(c.values()), 1)
        right, wrong, unclassified = (c[k] / n for k in ("right", "wrong", "unclassified"))
        return f"  {name:<14} {sum(c.values()):>4}  {right:7.1%}  {wrong:6.1%}  {unclassified:7.1%}"

    print(f"  {'':<14} {'n':>4}  {'correct':>7}  {'wrong':>6}  {'unclass':>7}")
    print(row("ALL", total))
    for project, c in sorted(per_project.items()):
        print(row(project, c))


if __name__ == "__main__":
    main()
