"""No log regex rescans the rest of a line from every position: its cost stays linear in the line.

``re.search`` tries a pattern at every position of the text. A pattern whose first element is an unbounded
repeat that runs through ordinary words (``[^\\n]*?``, ``[\\w ]*``) then walks to the end of the line from every
position before failing: quadratic in the line. Lines are cut to 8192 characters, which still made one rule
(LOG099, "address already in use") take 5.6 s on a 6 KB log whose long first line lacked its words. The
check below reads each regex's parse tree: every match must begin with a literal or an anchor, or the
repeats before the first literal must be bounded or unable to cross a space.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from importlib import import_module
from typing import Any

import pytest

import usg.doctor.logs as logs_pkg
from usg.doctor.logs.classify import classify_text
from usg.doctor.logs.rules import RULES

_p: Any = import_module("re._parser")
_c: Any = import_module("re._constants")

_CATEGORIES = {
    _c.CATEGORY_DIGIT: str.isdigit,
    _c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdigit(),
    _c.CATEGORY_SPACE: str.isspace,
    _c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    _c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    _c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
}


def _matches_char(op: Any, av: Any, ch: str) -> bool:
    """Whether the one-character item ``(op, av)`` of a parse tree matches ``ch``."""
    if op is _c.ANY:
        return ch != "\n"
    if op is _c.LITERAL:
        return bool(av == ord(ch))
    if op is _c.NOT_LITERAL:
        return bool(av != ord(ch))
    if op is _c.CATEGORY:
        return bool(_CATEGORIES[av](ch))
    if op is _c.RANGE:
        return bool(av[0] <= ord(ch) <= av[1])
    if op is _c.IN:
        negated = bool(av) and av[0][0] is _c.NEGATE
        hit = any(_matches_char(o, a, ch) for o, a in av if o is not _c.NEGATE)
        return hit != negated
    return False


def _runs_through_text(items: list[Any]) -> bool:
    """A repeated item that goes on through words and the spaces between them."""
    if len(items) == 1 and items[0][0] is _c.SUBPATTERN:
        return _runs_through_text(list(items[0][1][-1]))
    return len(items) == 1 and all(_matches_char(*items[0], ch) for ch in "a ")


def leading(items: list[Any]) -> str | None:
    """How every match of ``items`` begins: "guarded" (with a literal or an anchor), "runaway" (an unbounded
    repeat that runs through text can come first) or None (these items do not decide it)."""
    for op, av in items:
        if op is _c.AT or op is _c.LITERAL:
            return "guarded"
        if op in (_c.IN, _c.ANY, _c.CATEGORY, _c.NOT_LITERAL, _c.ASSERT, _c.ASSERT_NOT):
            continue
        if op is _c.SUBPATTERN:
            if found := leading(list(av[-1])):
                return found
        elif op is _c.BRANCH:
            branches = [leading(list(b)) for b in av[1]]
            if "runaway" in branches:
                return "runaway"
            if all(b == "guarded" for b in branches):
                return "guarded"
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            low, high, sub = av
            found = leading(list(sub))
            if found == "runaway" or (found is None and high == _c.MAXREPEAT and _runs_through_text(list(sub))):
                return "runaway"
            if found == "guarded" and low > 0:
                return "guarded"
        else:
            return None
    return None


def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = {f"rule {r.code}": r.pattern for r in RULES}
    for info in pkgutil.iter_modules(logs_pkg.__path__):
        module = importlib.import_module(f"{logs_pkg.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                found.setdefault(f"{info.name}.{name}", value)
    return sorted(found.items())


def _runaway(pattern: str, flags: int = 0) -> bool:
    return leading(list(_p.parse(pattern, flags))) == "runaway"


@pytest.mark.parametrize(
    ("pattern", "runaway"),
    [
        (r"(?P<line>[^\n]*?(?:address already in use)[^\n]*)", True),  # LOG099 before the fix
        (r"ok|(?P<model>\w[\w ()./-]*?) requires Flash", True),  # LOG039 before the fix
        (r".*Error", True),
        (r"(?m:^)(?P<line>[^\n]*?address already in use)", False),
        (r"(?P<model>\w[\w ()./-]{0,100}?) requires Flash", False),  # bounded: linear
        (r"[\w.]+ has no attribute", False),  # a word run cannot cross a space
        (r"(?:(?:Check '[^'\n]*' failed at) \S+)*\s*Cannot", False),  # the repeat starts with a literal
        (r"\s*Workers? killed", False),
    ],
)
def test_the_check_tells_a_rescanning_pattern(pattern: str, runaway: bool) -> None:
    assert _runaway(pattern) is runaway


def test_no_log_regex_rescans_a_line_from_every_position() -> None:
    patterns = _patterns()
    assert len(patterns) > len(RULES)  # the module-level markers are read too
    bad = [name for name, p in patterns if _runaway(p.pattern, p.flags)]
    assert not bad, f"anchor these at a line start or bound their leading repeat: {bad}"


def test_a_long_line_before_the_cause_does_not_stall_the_rules() -> None:
    text = (
        "ERROR engine args: " + "arg=1 " * 4000 + "\n"
        "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use\n"
    )
    findings = classify_text(text, learned=False)
    assert "LOG099" in [f.code for f in findings]
