"""A literal pre-check for the log rules: the text a rule's regex cannot match without, read from the regex.

Most lines of a long log (a Triton or vLLM server's INFO records) match no rule, and running ~100
regexes over every line cost ~0.2–0.7 ms a line (several rules start with variable-width
constructs, which Python's ``re`` retries at every position). Every match of a regex contains at
least one of the literals :func:`required_literals` reads from its parse tree: a run of literal
characters in sequence, or, for an alternation, one such literal from each branch. When none of
them is in the text, the regex is not run: a fast substring test replaces it.

The check may only say "cannot match" when the regex cannot: literals are compared on text folded
as ``re.IGNORECASE`` folds ASCII letters (:func:`fold`; a non-ASCII character of the pattern ends a
literal), a repeat that may occur zero times, a lookaround, a character class or a backreference
gives no literal, and a pattern the reader does not understand gets no pre-check at all.

:class:`RuleGate` applies the literals of a whole rule list at once: each literal is indexed by a
whole word inside it (a run of letters, digits and ``_`` with a non-word character of the literal on
both sides, so that any text containing the literal contains that word as a whole token); a text's
tokens pick the candidate rules, and only those are tested for their literals and then run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import import_module
from typing import Any

# re's own parser (Python 3.11+: re._parser; sre_parse is its deprecated alias), private but stable: a parse
# tree it does not produce as expected only costs the pre-check (required_literals returns None)
_p: Any = import_module("re._parser")
_c: Any = import_module("re._constants")

__all__ = ["RuleGate", "fold", "may_match", "required_literals", "screen"]

# the non-ASCII characters re.IGNORECASE matches with an ASCII letter (its simple lowercase, or one of
# re's extra case pairs): folded to that letter so that a literal test never misses what the regex finds
_TO_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
_WORD = re.compile(r"[a-z0-9_]+")
_MIN_USEFUL = 3  # a pre-check whose shortest literal is shorter than this passes on most lines: not kept

Requirement = frozenset[str]


def fold(text: str) -> str:
    """``text`` lowercased as re.IGNORECASE compares ASCII letters (done once per text, then shared)."""
    return (text if text.isascii() else text.translate(_TO_ASCII)).lower()


@cache
def required_literals(pattern: re.Pattern[str]) -> Requirement | None:
    """Literals (lowercase) of which every match of ``pattern`` contains at least one; None: no pre-check."""
    try:
        parsed = _p.parse(pattern.pattern, pattern.flags)
        req = _sequence(list(parsed))
    except Exception:  # an unexpected parse tree: run the regex every time
        return None
    if not req or min(len(lit) for lit in req) < _MIN_USEFUL:
        return None
    return req


def may_match(pattern: re.Pattern[str], folded: str) -> bool:
    """False only if ``pattern`` cannot match a text whose :func:`fold` is ``folded``."""
    req = required_literals(pattern)
    return req is None or _any_in(req, folded)


def _any_in(literals: Iterable[str], folded: str) -> bool:
    for lit in literals:  # noqa: SIM110 (a loop, not any(<generator>): this runs for every line of a long log)
        if lit in folded:
            return True
    return False


def screen(pattern: re.Pattern[str], text: str, folded: str) -> bool:
    """``pattern.search(text)`` as a yes/no test, skipped when ``folded`` (:func:`fold` of ``text``) lacks
    every literal the pattern needs."""
    return may_match(pattern, folded) and pattern.search(text) is not None


def _score(req: Requirement) -> tuple[int, int]:
    return min(len(lit) for lit in req), -len(req)


def _sequence(items: list[tuple[Any, Any]]) -> Requirement | None:
    """The best requirement of a sequence: a run of literals, or the requirement of one of its parts."""
    best: Requirement | None = None
    run = ""

    def keep(req: Requirement | None) -> None:
        nonlocal best
        if req and (best is None or _score(req) > _score(best)):
            best = req

    for op, av in items:
        if op is _c.LITERAL and av < 128:
            run += chr(av).lower()
            continue
        if run:
            keep(frozenset([run]))
            run = ""
        keep(_node(op, av))
    if run:
        keep(frozenset([run]))
    return best


def _node(op: Any, av: Any) -> Requirement | None:
    if op is _c.SUBPATTERN:  # (group, add_flags, del_flags, body)
        return _sequence(list(av[3]))
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _sequence(list(av))
    if op is _c.BRANCH:  # (None, [branch, ...]): each branch must bring a literal
        union: set[str] = set()
        for branch in av[1]:
            req = _sequence(list(branch))
            if not req:
                return None
            union |= req
        return frozenset(union)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):  # (min, max, body)
        return _sequence(list(av[2])) if av[0] >= 1 else None
    return None  # classes, ANY, assertions, anchors, backreferences, conditionals: no literal


def _inner_word(literal: str) -> str | None:
    """The longest word of ``literal`` with a non-word character of the literal on both sides."""
    words = [m for m in _WORD.finditer(literal) if m.start() > 0 and m.end() < len(literal)]
    return max((m.group() for m in words), key=len, default=None)


class RuleGate:
    """Which of a list of patterns may match a text: their literals, indexed by whole words."""

    def __init__(self, patterns: Sequence[re.Pattern[str]]) -> None:
        self._literals: list[Requirement | None] = [required_literals(p) for p in patterns]
        self._unchecked: list[int] = []  # patterns without a pre-check: always candidates
        self._loose: list[tuple[str, int]] = []  # (literal, pattern) of patterns with a literal lacking an inner word
        self._by_word: dict[str, list[int]] = {}
        for i, req in enumerate(self._literals):
            if req is None:
                self._unchecked.append(i)
                continue
            words = [_inner_word(lit) for lit in req]
            if any(w is None for w in words):
                self._loose += [(lit, i) for lit in sorted(req)]
                continue
            for w in set(words):
                self._by_word.setdefault(str(w), []).append(i)

    def candidates(self, folded: str) -> list[int]:
        """Indices (in order) of the patterns that may match a text whose :func:`fold` is ``folded``."""
        picked = set(self._unchecked)
        for lit, i in self._loose:  # one flat loop: this runs for every line of a long log
            if lit in folded:
                picked.add(i)
        maybe: set[int] = set()
        for word in set(_WORD.findall(folded)):
            hit = self._by_word.get(word)
            if hit:
                maybe.update(hit)
        for i in maybe - picked:
            if _any_in(self._literals[i] or (), folded):
                picked.add(i)
        return sorted(picked)
