"""The literal pre-check of the log rules never changes an answer, and long logs stay fast and bounded."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import usg.doctor.logs.classify as classify
import usg.doctor.logs.reader as reader
from usg.doctor.logs.corpus import load_corpus
from usg.doctor.logs.prefilter import RuleGate, fold, required_literals, screen
from usg.doctor.logs.rules import RULES

# the non-ASCII letters re.IGNORECASE matches with ASCII ones, put where the ASCII ones were
_LOOKALIKES = str.maketrans({"i": "\u0130", "s": "\u017f", "k": "\u212a", "I": "\u0131"})


def _texts() -> list[str]:
    """Each excerpt as pasted, upper-cased and with look-alike letters, plus its 5-line windows (where ``^``
    and ``$`` land on other lines); the case variants of the windows would only repeat the excerpt's."""
    out = []
    for case in load_corpus():
        text = case.excerpt
        lines = text.splitlines()
        out += [text, text.upper(), text.translate(_LOOKALIKES)]
        out += [w for w in ("\n".join(lines[i : i + 5]) for i in range(len(lines))) if w != text]
    return out


TEXTS = _texts()


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        (r"out of memory", {"out of memory"}),
        (r"CUDA (?:error|failure): (?P<what>\w+)", {"cuda "}),
        (r"byte size mismatch|not enough space", {"byte size mismatch", "not enough space"}),
        (r"(?:Failed|Unable) to load '(?P<m>[^']+)'", {" to load '"}),
        (r"\d+ bytes (?:is|are) above", {" bytes "}),
        (r"(?:abcdef)+ tail", {"abcdef"}),  # the longer of two sure literals
    ],
)
def test_literals_every_match_contains(pattern: str, literals: set[str]) -> None:
    assert required_literals(re.compile(pattern, re.IGNORECASE)) == literals


@pytest.mark.parametrize(
    "pattern",
    [
        r"(?:foo)? \d+",  # optional: a match may lack it
        r"ab|\d+",  # one branch without a literal
        r"ab",  # shorter than a useful pre-check
        r"x(?=needle)",  # lookarounds bring no literal
        r"(?:[a-z]+)-(?:\d)",
    ],
)
def test_patterns_without_a_sure_literal_get_no_pre_check(pattern: str) -> None:
    assert required_literals(re.compile(pattern, re.IGNORECASE)) is None


def test_folding_matches_what_ignorecase_matches() -> None:
    pattern = re.compile(r"kill signal", re.IGNORECASE)
    for text in ("KILL SIGNAL", "\u212aill \u017f\u0130gnal", "kill \u017figna\u006c"):
        assert pattern.search(text) is not None
        assert screen(pattern, text, fold(text)), text


def test_no_rule_that_matches_a_real_report_is_skipped() -> None:
    """Every rule whose regex matches a corpus excerpt (as pasted, upper-cased, or with look-alike letters, or a
    window of it) is among the gate's candidates for that text."""
    gate = RuleGate([r.pattern for r in RULES])
    matched = 0
    for text in TEXTS:
        candidates = set(gate.candidates(fold(text)))
        for i, rule in enumerate(RULES):
            if rule.pattern.search(text) is not None:
                matched += 1
                assert i in candidates, (rule.code, text[:200])
    assert matched > 1000  # the corpus exercises the rules, not a handful of them


@settings(max_examples=300, deadline=None)
@given(
    rule=st.sampled_from(range(len(RULES))),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    upper=st.booleans(),
)
def test_a_rule_literal_in_any_surrounding_text_keeps_its_rule(rule: int, before: str, after: str, upper: bool) -> None:
    gate = RuleGate([r.pattern for r in RULES])
    for literal in required_literals(RULES[rule].pattern) or ():
        text = before + (literal.upper() if upper else literal) + after
        assert rule in gate.candidates(fold(text)) or RULES[rule].pattern.search(text) is None


def test_the_markers_screened_agree_with_their_regexes() -> None:
    for text in TEXTS:
        head = text.splitlines()[0] if text else ""
        folded = fold(head)
        for pattern in (
            classify._NOT_ERROR,
            classify._ERRORISH,
            classify._WARNISH,
            classify._PROBLEMISH,
            classify._EXCEPTION_NAMED,
            classify._FATAL_SIGNAL,
        ):
            assert screen(pattern, head, folded) == (pattern.search(head) is not None), (pattern.pattern[:30], head)


class _Everything:
    def candidates(self, folded: str) -> list[int]:
        return list(range(len(RULES)))


def test_answers_on_the_corpus_are_those_without_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    def answers() -> list[list[tuple[str, str, int | None]]]:
        return [
            [(f.code, f.root_cause.value, f.location.line) for f in classify.classify_text(c.excerpt, learned=False)]
            for c in load_corpus()
        ]

    gated = answers()
    monkeypatch.setattr(classify, "_GATE", _Everything())
    assert gated == answers()


def test_a_huge_line_is_read_by_its_ends() -> None:
    line = "2026-12-06 ERROR " + "x=" * 2_000_000 + " RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    bounded = reader.bounded(line)
    assert len(bounded) < reader.MAX_LINE_CHARS + 60
    assert bounded.startswith(line[:4096]) and bounded.endswith(line[-4096:]) and "characters cut ...]" in bounded
    findings = classify.classify_text(line, learned=False)
    assert [f.code for f in findings] == ["LOG012"]  # the cause at the end of a 4 MB line is still read


def test_progress_is_reported_for_a_long_log() -> None:
    lines = [f"2026-12-06 INFO step {i} ok" for i in range(45_000)]
    lines.insert(30_000, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    seen: list[tuple[int, int]] = []
    findings = classify.classify_text("\n".join(lines), learned=False, progress=lambda d, n: seen.append((d, n)))
    assert [f.code for f in findings] == ["LOG012"]
    assert seen[-1] == (45_001, 45_001)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) >= 3
