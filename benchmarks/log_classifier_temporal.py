"""`usg doctor logs` on the older unseen batches: each batch classified with the corpus as it was before it.

Leave-one-project-out (benchmarks/log_classifier.py) over-states precision on new threads: the corpus holds
near-duplicates of a message family across projects. Every unseen batch (see the corpus PROVENANCE.md) entered the
corpus in one commit; here each batch is classified by the code on the import path with the learned layer fitted on
the corpus at that commit's parent (the batch's threads left out), at the shipped temperature and the thresholds
given. The rules are optimistic here (written after those batches were read); the learned layer is not.

Run: python benchmarks/log_classifier_temporal.py [--thresholds 0.48,0.54,0.60] [--details] [--last 12]
"""

from __future__ import annotations

import argparse
import collections

from log_classifier_unseen import corpus_at

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import thread_key
from usg.doctor.logs.model import DEFAULT_CALIBRATION, Calibration
from usg.doctor.logs.similar import CaseIndex

# (parent, commit) of each unseen batch added to the corpus, oldest first; batch 13 (session 18) was studied after
# it was measured on arrival, so the judge of later changes is batches 2-12 (--last 12)
BATCHES = (
    ("d1a238e", "dbfbd33"),  # batch 2 (session 7, 21 entries)
    ("ee3d1ff", "ad85f66"),  # batch 3
    ("e0e0f81", "34f1874"),  # batch 4
    ("4c03c6a", "c6a8372"),  # batch 5
    ("17e1ea6", "fef3cdf"),  # batch 6
    ("b8356a2", "a0a2d1c"),  # batch 7
    ("9fd8505", "b467516"),  # batch 8 (session 13, 35 entries)
    ("b2ab69e", "5ddde64"),  # batch 9 (session 14, 32 entries)
    ("73a216b", "a2ea5b1"),  # batch 10 (session 15, 33 entries)
    ("cfb9ba7", "b6b7ac2"),  # batch 11 (session 16, 30 entries)
    ("cb13c45", "2fcaf81"),  # batch 12 (session 17, 26 entries)
    ("690e14a", "e52bb84"),  # batch 13 (session 18, 22 entries)
    ("7943f79", "333d9b1"),  # batch 14 (session 19, 22 entries; studied in session 20)
    ("411be82", "2e50fea"),  # batch 15 (session 20, 25 entries; studied in session 21)
    ("042c375", "dcba1cc"),  # batch 16 (session 21, 27 entries; studied in session 22)
    ("255a8a3", "f0442a6"),  # batch 17 (session 22, 29 entries; measured in session 22, its misses listed)
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default=str(DEFAULT_CALIBRATION.threshold), help="comma-separated")
    parser.add_argument("--details", action="store_true", help="list every entry not classified correctly")
    parser.add_argument("--last", type=int, default=len(BATCHES) + 1, help="the newest batch measured (2-17)")
    parser.add_argument("--per-batch", action="store_true", help="also print each batch's counts (first threshold)")
    args = parser.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    totals = {t: collections.Counter[str]() for t in thresholds}
    per_batch: dict[str, collections.Counter[str]] = {}
    for number, (before, after) in enumerate(BATCHES[: args.last - 1], start=2):
        old = {(c.url, c.excerpt) for c in corpus_at(before)}
        new = [c for c in corpus_at(after) if (c.url, c.excerpt) not in old]
        measured = {c.thread for c in new}
        index = CaseIndex([c for c in corpus_at(before) if c.thread not in measured])
        for t in thresholds:
            ix = index.with_calibration(Calibration(DEFAULT_CALIBRATION.temperature, t))
            for case in new:
                root = root_error(classify_text(case.excerpt, "<unseen>", index=ix))
                got = root.root_cause if root is not None and root.root_cause is not RootCause.UNCLASSIFIED else None
                outcome = "unclassified" if got is None else ("right" if got is case.root_cause else "wrong")
                totals[t][outcome] += 1
                if t == thresholds[0]:
                    per_batch.setdefault(f"batch {number} ({after})", collections.Counter[str]())[outcome] += 1
                if args.details and outcome != "right" and t == thresholds[0]:
                    code = root.code if root is not None else "-"
                    print(
                        f"    {after} {outcome:<12} {case.root_cause.value:>20} -> {got.value if got else '-':<20} "
                        f"{code} {thread_key(case.url)}"
                    )
    if args.per_batch:
        for name, c in per_batch.items():
            print(f"  {name:<24} right {c['right']:>3}  wrong {c['wrong']:>3}  unclassified {c['unclassified']:>3}")
    print(f"  {'threshold':<10} {'n':>4}  {'correct':>7}  {'wrong':>6}  {'unclass':>7}  cost (3 wrong + unclassified)")
    for t, c in totals.items():
        n = max(sum(c.values()), 1)
        print(
            f"  {t:<10} {n:>4}  {c['right'] / n:7.1%}  {c['wrong'] / n:6.1%}  {c['unclassified'] / n:7.1%}  "
            f"{3 * c['wrong'] + c['unclassified']}"
        )


if __name__ == "__main__":
    main()
