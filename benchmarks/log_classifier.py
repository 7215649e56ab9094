"""How well does `usg doctor logs` classify real user reports it has not seen? Leave-one-project-out.

For each project of the labelled corpus (src/usg/doctor/logs/corpus), the learned layer (linear
SVM over TF-IDF word/char n-grams and engineered features, nearest known cases as evidence) is
fitted on the *other* projects only, and its softmax temperature and abstain threshold are chosen
on those training projects alone, by an inner leave-one-project-out (nested: the test project
never tunes anything). Every excerpt of the held-out project is then classified as a whole log
(rules first, then the learned layer) and its root error compared with the label. The rules-only
classifier and the learned layer alone are measured in the same run.

Targets (issue #20): accuracy >= 85%, wrong class <= 5%, unclassified <= 10%.

Caveat: some signature rules were written after reading this corpus (sessions 1-4), so the rows with
rules are optimistic for the message families the rules cover; the "learned layer alone" row has no
rules in the loop.

Run: python benchmarks/log_classifier.py [--details] [--shipped] [--corpus DIR] [--projects P,Q | --whole-calibration]
(--shipped: skip the nested calibration and use the shipped temperature/threshold in every split —
faster, but those values were chosen on the whole corpus, test projects included. --projects: hold out
only these projects (each still trained on all others, so the runs of a split add up to the whole run,
per project and per class; for the shared 600-s lock); --whole-calibration: only the calibration chosen
on all projects, which a split run leaves out.)
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import dataclass
from pathlib import Path

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase, load_corpus
from usg.doctor.logs.model import DEFAULT_CALIBRATION, Calibration, calibrate
from usg.doctor.logs.similar import CaseIndex

TARGETS = {"accuracy": 0.85, "wrong": 0.05, "unclassified": 0.10}


@dataclass
class Tally:
    right: int = 0
    wrong: int = 0
    unclassified: int = 0

    @property
    def n(self) -> int:
        return self.right + self.wrong + self.unclassified

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)

    def row(self, name: str) -> str:
        n = max(self.n, 1)
        return (
            f"  {name:<22} {self.n:>4}  {self.right / n:>7.1%}  {self.wrong / n:>6.1%}  {self.unclassified / n:>7.1%}"
        )


def long_log(excerpt: str) -> str:
    """The excerpt as it sits in a real start-up log: 160 info lines before it, then a generic cascade
    (what servers print after the first error) and 160 more lines — the root error must still be found."""
    before = [
        f"I1203 10:00:{i % 60:02d}.{i:06d} 1 model_lifecycle.cc:{300 + i}] loading: model_{i}:1" for i in range(160)
    ]
    cascade = [
        "E1203 10:01:00.000000 1 model_repository_manager.cc:1186] failed to load all models",
        "error: creating server: Internal - failed to load all models",
        "I1203 10:01:00.100000 1 server.cc:307] Waiting for in-flight requests to complete.",
    ]
    after = [f"INFO 12-03 10:01:{i % 60:02d} [launcher.py:{i}] Shutting down worker {i}" for i in range(160)]
    return "\n".join([*before, *excerpt.splitlines(), *cascade, *after])


def outcome(case: LabelledCase, index: CaseIndex | None, rules: bool = True, embed: bool = False) -> tuple[str, str]:
    if not rules:  # the learned layer alone, on the whole excerpt
        assert index is not None
        pred = index.predict(case.excerpt).root_cause
        if pred is None:
            return "unclassified", "-"
        return ("right" if pred is case.root_cause else "wrong"), pred.value
    text = long_log(case.excerpt) if embed else case.excerpt
    findings = classify_text(text, "<corpus>", index=index, learned=index is not None)
    root = root_error(findings)
    if root is None or root.root_cause is RootCause.UNCLASSIFIED:
        return "unclassified", "-"
    return ("right" if root.root_cause is case.root_cause else "wrong"), root.root_cause.value


_FITTED: dict[frozenset[str], CaseIndex] = {}
_CALIBRATED: dict[tuple[str, bool], Calibration] = {}


def fit_index(train: list[LabelledCase]) -> CaseIndex:
    """An index (and its linear layer) fitted on ``train``, memoised by the projects it leaves out
    (the nested splits of held-out projects p, q and q, p train on the same cases: fitted once)."""
    key = frozenset(load_corpus_projects() - {c.project for c in train})
    if key not in _FITTED:
        _FITTED[key] = CaseIndex(train)
    return _FITTED[key]


_CORPUS: list[Path] = []  # --corpus DIR (default: the packaged corpus)


def load_corpus_projects() -> set[str]:
    return {c.project for c in load_corpus(directory=_CORPUS[0] if _CORPUS else None)}


def rules_only(case: LabelledCase) -> bool:
    """True when the signature rules classify the excerpt (the learned layer is not reached)."""
    root = root_error(classify_text(case.excerpt, "<corpus>", learned=False))
    return root is not None and root.root_cause is not RootCause.UNCLASSIFIED


def evaluate(
    cases: list[LabelledCase],
    learned: bool,
    details: bool,
    rules: bool = True,
    nested: bool = True,
    embed: bool = False,
    held_out: set[str] | None = None,
) -> tuple[Tally, dict[str, Tally], dict[str, Tally], list[float]]:
    total, per_project, per_class = Tally(), collections.defaultdict(Tally), collections.defaultdict(Tally)
    seconds: list[float] = []
    by_rules = {id(c): rules_only(c) for c in cases} if learned and rules else {}
    for project in sorted({c.project for c in cases} & (held_out or {c.project for c in cases})):
        train = [c for c in cases if c.project != project]
        index = None
        if learned:
            cal = DEFAULT_CALIBRATION
            if nested:  # chosen on the training projects only (once per held-out project and pipeline)
                key = (project, rules)
                if key not in _CALIBRATED:
                    reaches = (lambda c: not by_rules[id(c)]) if rules else (lambda c: True)
                    _CALIBRATED[key] = calibrate(train, fit_index, reaches)
                cal = _CALIBRATED[key]
            index = fit_index(train).with_calibration(cal)
            print(f"    held out {project:<13} calibration {cal}", flush=True)
        for case in (c for c in cases if c.project == project):
            start = time.perf_counter()
            result, got = outcome(case, index, rules, embed)
            seconds.append(time.perf_counter() - start)
            total.add(result)
            per_project[project].add(result)
            per_class[case.root_cause.value].add(result)
            if details and result != "right":
                print(f"    {result:<12} {case.root_cause.value:>20} -> {got:<20} {case.url}")
    return total, per_project, per_class, seconds


def report(
    title: str, total: Tally, per_project: dict[str, Tally], per_class: dict[str, Tally], seconds: list[float]
) -> None:
    header = f"  {'':<22} {'n':>4}  {'correct':>7}  {'wrong':>6}  {'unclass':>7}"
    print(f"\n{title}\n{header}")
    print(total.row("ALL"))
    print("  per project (held out):")
    for name, t in sorted(per_project.items()):
        print(t.row(name))
    print("  per class (label):")
    for name, t in sorted(per_class.items()):
        print(t.row(name))
    seconds = sorted(seconds)
    print(
        f"  time per excerpt: median {1e3 * seconds[len(seconds) // 2]:.1f} ms, max {1e3 * seconds[-1]:.1f} ms "
        f"(machine shared with other work)"
    )


def long_log_timing(cases: list[LabelledCase]) -> None:
    """What a user waits for: the packaged index built once (CLI start), then a 400-line log."""
    start = time.perf_counter()
    index = CaseIndex.default()
    built = time.perf_counter() - start
    noise = [
        f"I1203 10:00:{i % 60:02d}.{i:06d} 1 grpc_server.cc:{200 + i}] Ready for RPC 'Handler{i}'" for i in range(380)
    ]
    log = "\n".join(noise + [c.excerpt for c in cases[:20]])
    start = time.perf_counter()
    findings = classify_text(log, "long.log", index=index)
    took = time.perf_counter() - start
    print(
        f"\nspeed: packaged index built in {built:.2f} s; a {len(log.splitlines())}-line log with 20 errors "
        f"classified in {took:.2f} s ({len(findings)} findings)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--details", action="store_true", help="list every case not classified correctly")
    parser.add_argument("--shipped", action="store_true", help="use the shipped calibration (not nested)")
    parser.add_argument("--corpus", help="a directory of corpus *.jsonl files instead of the packaged corpus")
    parser.add_argument("--projects", help="comma-separated: hold out only these projects (a split run)")
    parser.add_argument("--whole-calibration", action="store_true", help="only the calibration chosen on all projects")
    args = parser.parse_args()
    nested = not args.shipped
    if args.corpus:
        _CORPUS.append(Path(args.corpus))
    cases = load_corpus(directory=_CORPUS[0] if _CORPUS else None)
    print(f"corpus: {len(cases)} labelled excerpts from {len({c.project for c in cases})} projects")
    start = time.perf_counter()
    if args.whole_calibration:
        whole = calibrate(cases, fit_index, lambda c: not rules_only(c))
        print(f"calibration chosen on all projects: {whole}; shipped: {DEFAULT_CALIBRATION}")
        print(f"\n({time.perf_counter() - start:.1f} s)")
        return
    held_out = set(args.projects.split(",")) if args.projects else None
    if held_out:
        unknown = held_out - {c.project for c in cases}
        if unknown:
            parser.error(f"no such project in the corpus: {', '.join(sorted(unknown))}")
        print(f"split run: holding out only {', '.join(sorted(held_out))}")
    base = evaluate(cases, learned=False, details=False, held_out=held_out)
    report("baseline: signature rules only", *base)
    how = "nested calibration" if nested else "shipped calibration (NOT nested)"
    print(f"\nlearned layer alone (no rules), leave-one-project-out, {how}:")
    alone = evaluate(cases, learned=True, details=False, rules=False, nested=nested, held_out=held_out)
    print(alone[0].row("ALL"))
    print(f"\nrules + learned layer, leave-one-project-out, {how}:")
    learned = evaluate(cases, learned=True, details=args.details, nested=nested, held_out=held_out)
    report(f"rules + learned layer, leave-one-project-out, {how}", *learned)
    print(f"\nthe same excerpts inside 320-line logs (start-up noise, a cascade after the error), {how}:")
    embedded = evaluate(cases, learned=True, details=False, nested=nested, embed=True, held_out=held_out)
    print(embedded[0].row("ALL (root error)"))
    if nested and not held_out:
        whole = calibrate(cases, fit_index, lambda c: not rules_only(c))
        note = "" if whole == DEFAULT_CALIBRATION else "  <- differs from the shipped value: update model.py"
        print(f"\ncalibration chosen on all projects: {whole}; shipped: {DEFAULT_CALIBRATION}{note}")
    long_log_timing(cases)
    total = learned[0]
    n = max(total.n, 1)
    got = {"accuracy": total.right / n, "wrong": total.wrong / n, "unclassified": total.unclassified / n}
    print("\ntargets:")
    for key, target in TARGETS.items():
        ok = got[key] >= target if key == "accuracy" else got[key] <= target
        print(
            f"  {key:<13} {got[key]:6.1%}  target {'>=' if key == 'accuracy' else '<='} {target:.0%}  "
            f"{'met' if ok else 'NOT met'}"
        )
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
