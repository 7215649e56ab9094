"""How much of the corpus's class can be read from the excerpt at all? Blind readers against the labels.

Issue #20 measures `usg doctor logs` against the labelled corpus (src/usg/doctor/logs/corpus): each label is
the labeller's judgement from the message *and the thread* (what the maintainers found, the versions, the fix).
A classifier sees only the message. This script reads blind annotations of every corpus excerpt — readers who saw
the excerpt and its project only (no URL, no thread, no label, no resolution), the class definitions and the
corpus's labelling conventions (benchmarks/log_blind/guide.md), and gave a forced-choice class plus whether the
excerpt alone settles it — and prints:

- each reader's agreement with the corpus label (all entries; those the reader called settled; the others);
- agreement between the two readers of each entry (raw and Cohen's kappa);
- the ceiling readings: entries both readers got right, entries at least one got right, entries where both readers
  agree with each other against the label and both call it settled (label or thread knowledge decides);
- with --lopo-details FILE (the output of `python benchmarks/log_classifier.py --details`): `usg doctor logs`'s
  nested leave-one-project-out outcome per entry, cross-tabulated against the readers;
- with --batches: the readers on each unseen batch (benchmarks/log_classifier_temporal.py's BATCHES, read from git
  history), to set beside what `usg doctor logs` answered when each batch arrived.

Run: python benchmarks/log_label_ceiling.py [--annotations benchmarks/log_blind/annotations.jsonl]
       [--lopo-details FILE] [--disputes] [--batches]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
from pathlib import Path

from usg.doctor.findings import RootCause
from usg.doctor.logs.corpus import LabelledCase, load_corpus

HERE = Path(__file__).resolve().parent
CLASSES = [c.value for c in RootCause if c is not RootCause.UNCLASSIFIED]
DETAIL = re.compile(r"^\s+(wrong|unclassified)\s+(\w+) -> (\S+)\s+(\S+)\s*$")


def entry_key(case: LabelledCase) -> str:
    """A corpus entry's identity: its thread and the hash of its excerpt (a thread may give several entries)."""
    digest = hashlib.sha1(case.excerpt.encode()).hexdigest()[:16]
    return f"{case.url}#{digest}"


def kappa(pairs: list[tuple[str, str]]) -> float:
    """Cohen's kappa of two readers' classes over the same entries."""
    n = len(pairs)
    if n == 0:
        return float("nan")
    observed = sum(a == b for a, b in pairs) / n
    left = collections.Counter(a for a, _ in pairs)
    right = collections.Counter(b for _, b in pairs)
    expected = sum(left[c] * right[c] for c in set(left) | set(right)) / (n * n)
    return (observed - expected) / (1 - expected) if expected < 1 else float("nan")


def pct(k: int, n: int) -> str:
    return f"{k / n:6.1%} ({k}/{n})" if n else "     - (0/0)"


def lopo_outcomes(path: Path, cases: list[LabelledCase]) -> tuple[dict[str, str], int]:
    """Each entry's outcome in the nested leave-one-project-out run whose --details output is ``path``:
    'right' unless listed; a listed (url, label) with several entries marks that many of them (ambiguous
    assignments are counted and returned)."""
    listed: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        m = DETAIL.match(line)
        if m:
            listed[(m.group(4), m.group(2))].append(m.group(1))
    out: dict[str, str] = {}
    ambiguous = 0
    by_pair: dict[tuple[str, str], list[LabelledCase]] = collections.defaultdict(list)
    for case in cases:
        by_pair[(case.url, case.root_cause.value)].append(case)
    for pair, group in by_pair.items():
        misses = listed.pop(pair, [])
        if misses and len(group) > len(misses):
            ambiguous += len(misses)
        for i, case in enumerate(group):
            out[entry_key(case)] = misses[i] if i < len(misses) else "right"
    if listed:
        raise SystemExit(f"--lopo-details lists entries not in the corpus: {sorted(listed)[:3]} …")
    return out, ambiguous


def unseen_batches(pairs: dict[str, list[dict]], by_key: dict[str, LabelledCase]) -> None:
    """The readers on each unseen batch: the entries its commit added to the corpus."""
    from log_classifier_temporal import BATCHES
    from log_classifier_unseen import corpus_at

    print("\nthe readers on each unseen batch (each entry read by two readers):")
    print(f"  {'batch':<16} {'n':>4} {'right':>7} {'both right':>10} {'settled':>8} {'right if settled':>16}")
    total = collections.Counter[str]()
    for number, (before, after) in enumerate(BATCHES, start=2):
        old = {entry_key(c) for c in corpus_at(before)}
        new = [k for k in (entry_key(c) for c in corpus_at(after)) if k not in old and k in pairs]
        notes = [(a, by_key[k].root_cause.value) for k in new for a in pairs[k]]
        c = collections.Counter[str](
            right=sum(a["class"] == lab for a, lab in notes),
            both=sum(all(a["class"] == by_key[k].root_cause.value for a in pairs[k]) for k in new),
            settled=sum(a["determined"] for a, _ in notes),
            settled_right=sum(a["determined"] and a["class"] == lab for a, lab in notes),
            n=len(new),
        )
        total.update(c)
        _batch_row(f"batch {number} ({after})", c)
    _batch_row("all", total)


def _batch_row(name: str, c: collections.Counter[str]) -> None:
    n = max(c["n"], 1)
    print(
        f"  {name:<16} {c['n']:>4} {c['right'] / (2 * n):>7.1%} {c['both'] / n:>10.1%} {c['settled'] / (2 * n):>8.1%} "
        f"{c['settled_right'] / max(c['settled'], 1):>16.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotations", default=str(HERE / "log_blind" / "annotations.jsonl"))
    parser.add_argument("--lopo-details", help="output of `python benchmarks/log_classifier.py --details`")
    parser.add_argument("--disputes", action="store_true", help="list entries both readers settle against the label")
    parser.add_argument("--batches", action="store_true", help="the readers on each unseen batch (needs git history)")
    args = parser.parse_args()

    cases = load_corpus()
    by_key = {entry_key(c): c for c in cases}
    notes: dict[str, dict[str, dict]] = collections.defaultdict(dict)  # entry → reader → annotation
    for n, line in enumerate(Path(args.annotations).read_text().splitlines(), 1):
        if not line.strip():
            continue
        a = json.loads(line)
        if a["entry"] not in by_key:
            raise SystemExit(f"{args.annotations}:{n}: entry {a['entry']} is not in the corpus (edited since?)")
        if a["class"] not in CLASSES:
            raise SystemExit(f"{args.annotations}:{n}: class {a['class']!r} is not a root-cause class")
        notes[a["entry"]][a["reader"]] = a
    missing = [k for k in by_key if len(notes.get(k, {})) < 2]
    print(f"corpus: {len(cases)} entries; annotated by two readers: {len(cases) - len(missing)}")

    print("\neach reader against the corpus label (forced choice):")
    print(f"  {'reader':<8} {'all':>16} {'settled share':>16} {'right if settled':>18} {'right if not':>16}")
    readers = sorted({r for per in notes.values() for r in per})
    for reader in readers:
        rows = [(by_key[k], per[reader]) for k, per in notes.items() if reader in per]
        right = [c.root_cause.value == a["class"] for c, a in rows]
        settled = [a["determined"] for _, a in rows]
        rs = sum(r for r, s in zip(right, settled, strict=True) if s)
        rn = sum(r for r, s in zip(right, settled, strict=True) if not s)
        ns = sum(settled)
        print(
            f"  {reader:<8} {pct(sum(right), len(rows)):>16} {pct(ns, len(rows)):>16} {pct(rs, ns):>18} "
            f"{pct(rn, len(rows) - ns):>16}"
        )

    pairs = {k: sorted(per.values(), key=lambda a: a["reader"]) for k, per in notes.items() if len(per) == 2}
    print("\ntwo readers of one entry:")
    by_team: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for two in pairs.values():
        by_team[f"{two[0]['reader']}+{two[1]['reader']}"].append((two[0]["class"], two[1]["class"]))
    for team, cls in sorted(by_team.items()):
        agree = sum(a == b for a, b in cls)
        print(f"  {team:<8} agree {pct(agree, len(cls))}, Cohen's kappa {kappa(cls):.2f}")

    n = len(pairs)
    both = sum(all(a["class"] == by_key[k].root_cause.value for a in two) for k, two in pairs.items())
    either = sum(any(a["class"] == by_key[k].root_cause.value for a in two) for k, two in pairs.items())
    disputes = [
        k
        for k, two in pairs.items()
        if two[0]["class"] == two[1]["class"] != by_key[k].root_cause.value and all(a["determined"] for a in two)
    ]
    settled_agree = [
        k for k, two in pairs.items() if two[0]["class"] == two[1]["class"] and all(a["determined"] for a in two)
    ]
    print("\nceiling readings (entries with two readers):")
    print(f"  both readers give the label                               {pct(both, n)}")
    print(f"  at least one reader gives the label                       {pct(either, n)}")
    print(f"  neither reader gives the label                            {pct(n - either, n)}")
    sa_right = sum(by_key[k].root_cause.value == pairs[k][0]["class"] for k in settled_agree)
    print(f"  both call it settled and agree: the label among those     {pct(sa_right, len(settled_agree))}")
    print(f"  both settle on one class that is not the label            {pct(len(disputes), n)}")

    print("\nper class (label): both readers give it / at least one / neither")
    for cls in CLASSES:
        ks = [k for k in pairs if by_key[k].root_cause.value == cls]
        if not ks:
            continue
        b = sum(all(a["class"] == cls for a in pairs[k]) for k in ks)
        e = sum(any(a["class"] == cls for a in pairs[k]) for k in ks)
        print(
            f"  {cls:<20} n={len(ks):>3}  both {b / len(ks):6.1%}  one+ {e / len(ks):6.1%}  "
            f"neither {1 - e / len(ks):6.1%}"
        )

    if args.lopo_details:
        outcome, ambiguous = lopo_outcomes(Path(args.lopo_details), cases)
        print(f"\nusg doctor logs, nested leave-one-project-out ({args.lopo_details}; {ambiguous} outcomes assigned")
        print("among entries of one thread with one label), against the readers:")
        print(f"  {'readers':<34} {'n':>4} {'usg right':>9} {'wrong':>7} {'unclass':>8}")
        groups = {
            "both readers give the label": lambda two, lab: all(a["class"] == lab for a in two),
            "one reader gives the label": lambda two, lab: sum(a["class"] == lab for a in two) == 1,
            "neither reader gives the label": lambda two, lab: all(a["class"] != lab for a in two),
        }
        for name, test in groups.items():
            ks = [k for k, two in pairs.items() if test(two, by_key[k].root_cause.value)]
            c = collections.Counter(outcome[k] for k in ks)
            m = max(len(ks), 1)
            print(
                f"  {name:<34} {len(ks):>4} {c['right'] / m:>9.1%} {c['wrong'] / m:>7.1%} {c['unclassified'] / m:>8.1%}"
            )
        c = collections.Counter(outcome[k] for k in pairs)
        print(f"  {'all':<34} {n:>4} {c['right'] / n:>9.1%} {c['wrong'] / n:>7.1%} {c['unclassified'] / n:>8.1%}")

    if args.batches:
        unseen_batches(pairs, by_key)

    if args.disputes:
        print("\nentries both readers settle on another class than the label:")
        for k in disputes:
            two = pairs[k]
            print(f"  {by_key[k].root_cause.value:>18} -> {two[0]['class']:<18} {by_key[k].url}")
            for a in two:
                print(f"      {a['reader']}: {a.get('note', '')}")


if __name__ == "__main__":
    main()
