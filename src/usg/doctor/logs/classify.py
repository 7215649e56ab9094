"""``usg doctor logs``: find the error lines in a log and classify each into a root cause.

How a log is read:

1. A Python traceback (``Traceback (most recent call last):`` … frames …) is one event: only
   its final exception line (plus the lines that continue that message) is classified, once.
   Frames and source lines inside it are never matched on their own.
2. Every other line is matched against the rules of :mod:`usg.doctor.logs.rules`; a rule may read
   the next few lines for values (ONNX Runtime writes ``index: 0 Got: 32 Expected: 1`` below).
3. A line no rule matches but that looks like an error (``ERROR``, ``[E]``, glog ``E0412``,
   ``…Error:``/``Exception:``, ``failed``) becomes ``LOG000`` — unclassified, never forced into
   a class.
4. The same code with the same values seen again is merged into one finding with a count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from usg.doctor.findings import Finding, Location, Stage
from usg.doctor.logs.rules import RULES, LogRule, codes
from usg.doctor.registry import finding, register_codes

__all__ = ["classify_line", "classify_text"]

register_codes(codes())

_LOOKAHEAD = 4
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_FRAME = re.compile(r"^\s+(File \"|\S)|^\s*$|^\s*\^+\s*$|^\s*~+")
_CHAIN = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
_ERRORISH = re.compile(
    r"(\b(ERROR|FATAL|CRITICAL)\b|\[E\]|\bE\d{4} |\[TRT\] \[E\]|^\w*(Error|Exception)\b|\w(Error|Exception): "
    r"|"
    r"\bfailed\b|\bFAILED\b|\bcannot\b|\bcould not\b|\bnot supported\b|\bunsupported\b|\bout of memory\b)",
    re.IGNORECASE,
)
_NOT_ERROR = re.compile(r"\b(0 errors?|no errors?|without errors?|error_count=0|errors?: 0)\b", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class _Event:
    line_no: int
    head: str
    window: str
    in_traceback: bool


def _events(lines: list[str]) -> Iterable[_Event]:
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        tb = _TRACEBACK.search(line)
        if tb:
            prefix = line[: tb.start()]  # e.g. "[rank0]: " put before every line by a launcher

            def strip(text: str, prefix: str = prefix) -> str:
                return text[len(prefix) :] if prefix and text.startswith(prefix) else text

            j = i + 1
            while j < n and (
                _FRAME.match(strip(lines[j])) or _TRACEBACK.search(lines[j]) or _CHAIN.match(strip(lines[j]))
            ):
                j += 1
            if j < n:
                # the final exception line, plus continuation lines of its message
                k = j + 1
                while k < n and k - j <= _LOOKAHEAD and lines[k].strip() and not _looks_like_new_record(lines[k]):
                    k += 1
                yield _Event(j + 1, strip(lines[j]), "\n".join(strip(x) for x in lines[j:k]), True)
                i = k
                continue
            i = j
            continue
        if (
            i + 1 < n and _TRACEBACK.search(lines[i + 1]) and not any(_match(r, line, line) for r in RULES)
        ):  # "ERROR ... inference failed" announcing the traceback below: the traceback says what failed
            i += 1
            continue
        yield _Event(i + 1, line, "\n".join(lines[i : i + 1 + _LOOKAHEAD]), False)
        i += 1


def _looks_like_new_record(line: str) -> bool:
    return bool(re.match(r"^(\d{4}-\d\d-\d\d|\[?\d\d[:/]\d\d|[IWEF]\d{4} |INFO|WARNING|ERROR|DEBUG|\[)", line))


def _match(rule: LogRule, head: str, window: str) -> re.Match[str] | None:
    m = rule.pattern.search(window)
    if m is None or m.start() >= len(head):
        return None
    return m


def classify_line(text: str, source: str = "<log>", line_no: int | None = None) -> Finding | None:
    """Classify one error message (which may span a few lines); None if it is not an error."""
    head = text.splitlines()[0] if text else ""
    return _classify(_Event(line_no or 1, head, text, False), source)


def _classify(ev: _Event, source: str) -> Finding | None:
    head = _ANSI.sub("", ev.head)
    window = _ANSI.sub("", ev.window)
    for rule in RULES:
        m = _match(rule, head, window)
        if m is None:
            continue
        ex = rule.explain(m)
        evidence = {k: v for k, v in ex.evidence.items() if v is not None}
        evidence["line_text"] = head.strip()[:400]
        return finding(
            rule.code,
            f"[{rule.system}] {ex.message}",
            Location(source, element=rule.system, line=ev.line_no),
            ex.fix,
            evidence,
            stage=Stage.LOGS,
            severity=ex.severity or rule.severity,
            root_cause=ex.root_cause or rule.root_cause,
        )
    if (ev.in_traceback or _ERRORISH.search(head)) and not _NOT_ERROR.search(head) and head.strip():
        return finding(
            "LOG000",
            f"unclassified error: {head.strip()[:300]}",
            Location(source, line=ev.line_no),
            "no rule knows this message; read the surrounding log lines (and report the message to extend the rules)",
            {"line_text": head.strip()[:400]},
            stage=Stage.LOGS,
        )
    return None


def classify_text(text: str, source: str = "<log>") -> list[Finding]:
    """Every classified error of a log, in order of first appearance, repeats merged (``evidence.count``)."""
    lines = text.splitlines()
    merged: dict[tuple[str, str], Finding] = {}
    counts: dict[tuple[str, str], list[int]] = {}
    for ev in _events(lines):
        f = _classify(ev, source)
        if f is None:
            continue
        values = {k: v for k, v in f.evidence.items() if k != "line_text"}
        key = (f.code, repr(sorted(values.items())) if values else f.evidence.get("line_text", ""))
        if f.code == "LOG000":
            key = (f.code, _normalise(f.evidence["line_text"]))
        if key in merged:
            counts[key].append(ev.line_no)
            continue
        merged[key] = f
        counts[key] = [ev.line_no]
    out: list[Finding] = []
    for key, f in merged.items():
        if len(counts[key]) > 1:
            f = replace(
                f,
                message=f.message + f" (seen {len(counts[key])} times)",
                evidence={**f.evidence, "count": len(counts[key]), "lines": counts[key][:20]},
            )
        out.append(f)
    return out


def _normalise(line: str) -> str:
    """Drop timestamps, pids and addresses so repeats of one message merge."""
    line = re.sub(r"^\S*\d{2}:\d{2}:\d{2}[\d.,]*\S*\s*", "", line)
    line = re.sub(r"0x[0-9a-f]+|\b\d+\b", "#", line, flags=re.IGNORECASE)
    return line.strip()
