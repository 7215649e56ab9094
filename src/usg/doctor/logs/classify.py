"""``usg doctor logs``: find the error lines in a log and classify each into a root cause.

How a log is read:

1. A Python traceback (``Traceback (most recent call last):`` … frames …) is one event: only
   its final exception line (plus the lines that continue that message) is classified, once.
   Frames and source lines inside it are never matched on their own.
2. Every other line is matched against the rules of :mod:`usg.doctor.logs.rules`; a rule may read
   the next few lines for values (ONNX Runtime writes ``index: 0 Got: 32 Expected: 1`` below).
3. A line no rule matches but that looks like an error (``ERROR``, ``[E]``, glog ``E0412``,
   ``…Error:``/``Exception:``, ``failed``, ONNX Runtime's ``onnxruntime_pybind11_state.Fail`` and
   ``[E:onnxruntime…]``, an exception class named anywhere on the line, a C++ exception nobody caught, a
   fatal signal) becomes ``LOG000`` — unclassified, never forced into a class. A traceback the paste cuts
   off before its exception line leaves the line that announced it.
4. Such a line then goes to the learned layer, fitted on the labelled corpus of real user reports
   (:mod:`usg.doctor.logs.similar`, :mod:`usg.doctor.logs.model`): a linear model over its error
   vocabulary, spelling, engine and values gives a class and a calibrated confidence; above the
   abstain threshold it becomes ``LOG050`` with that class, the evidence its causal line states and
   the nearest known cases' URLs; otherwise it stays ``LOG000``. Rule findings carry the nearest cases too.
5. The same code with the same values seen again is merged into one finding with a count.
6. :func:`root_error` picks the first root error of a long log (the first classified error that is
   not a generic cascade line such as "failed to load all models"); it is marked ``root_error``.
   A cascade line no rule knows (or a fatal signal: how a process died, not why) is never given a class by
   the learned layer: it states a consequence, so guessing its class would only stand in for the cause it
   follows. Nor is a generic Python exception (``KeyError: 'x'``, ``AttributeError: ... has no attribute ...``)
   whose message carries no cause vocabulary: it says where the code broke, not why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.logs.features import vocab_vector
from usg.doctor.logs.prefilter import RuleGate, fold, screen
from usg.doctor.logs.reader import bounded
from usg.doctor.logs.rules import RULES, LogRule, codes
from usg.doctor.registry import CodeInfo, finding, register_codes

if TYPE_CHECKING:
    from usg.doctor.logs.similar import CaseIndex

__all__ = ["LEARNED", "classify_line", "classify_lines", "classify_text", "default_index", "root_error"]

LEARNED = CodeInfo(
    "LOG050",
    Severity.ERROR,
    RootCause.UNCLASSIFIED,
    "error matched to known cases",
    "no rule knows the message, but the model learned from labelled real-world reports recognises it; "
    "the class comes with a calibrated confidence and the nearest known cases' URLs",
    also_severities=(Severity.WARNING,),
    also_root_causes=tuple(c for c in RootCause if c is not RootCause.UNCLASSIFIED),
)
register_codes([*codes(), LEARNED])
RULE_CONFIDENCE = 0.95

_FIXES: dict[RootCause, str] = {
    RootCause.DTYPE_OR_RANGE: "send (or declare) the dtype the model takes; cast on the client or re-export with it",
    RootCause.SHAPE_OR_RANK: "send the shape/length the model declares (resize, pad, or truncate on the client)",
    RootCause.BATCH_DIM_CONFIG: "make the batch dim agree: with max_batch_size > 0 leave it out of dims, and "
    "build engines whose profile covers the batch",
    RootCause.DYNAMIC_SHAPE_FIXED: "keep the axis dynamic: export with dynamic axes/shapes, build an optimization "
    "profile covering the sizes, avoid Python ints of tensor sizes in forward",
    RootCause.UNSUPPORTED_OP: "the op/architecture is not implemented by this runtime: raise the opset, upgrade the "
    "runtime, register a plugin/custom op, or rewrite the op",
    RootCause.OP_SEMANTIC_DRIFT: "compare the op's attributes between frameworks and re-export with matching ones",
    RootCause.MEMORY: "lower the memory the engine reserves (max length, batch, KV-cache fraction, workspace) or "
    "free the GPU from other processes",
    RootCause.VERSION_COUPLING: "align versions: the artifact was produced by a newer/older tool than the one "
    "loading it (upgrade the runtime or re-export for it)",
    RootCause.CONFIG_INVALID: "fix the configuration the message names (paths, names, dims, limits)",
    RootCause.ENVIRONMENT: "fix the environment: install the missing library/backend, match CUDA/driver versions, "
    "or give the process the resources (shared memory, GPU) it needs",
}
_CASCADE = re.compile(
    r"failed to load all models|ShardCannotStart|Shutting down|WebserverFailed|Engine core initiali[sz]ation failed|"
    r"core dumped|Error executing method|might cause deadlock|exited unexpectedly|see (?:the )?(?:above|previous)|"
    r"Webserver Crashed|terminate called",
    re.IGNORECASE,
)

# a Python exception of a generic kind (a missing key or attribute, a failed assert) states where the code broke,
# not why: with no cause vocabulary in the message (memory, dtype, shape, version, ...) its cause is only in the
# discussion, and the learned layer would guess from the spelling of a name
_GENERIC_EXCEPTION = re.compile(
    r"^\s*(?:[\w.]+\.)?(?:AttributeError|KeyError|IndexError|NameError|AssertionError|UnboundLocalError|"
    r"RecursionError)\b|\bTypeError: 'NoneType' object"
)

_LOOKAHEAD = 4
PROGRESS_EVERY = 20_000
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_FRAME = re.compile(r"^\s+(File \"|\S)|^\s*$|^\s*\^+\s*$|^\s*~+")
_CHAIN = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
_ERRORISH = re.compile(
    r"(\b(ERROR|FATAL|CRITICAL)\b|\[E\]|\[TRT\] \[E\]|^\w*(Error|Exception)\b|\w(Error|Exception) ?: "
    r"|"
    r"\bfailed\b|\bFAILED\b|\bcannot\b|\bcould not\b|\bnot supported\b|\bunsupported\b|\bout of memory\b|"
    # ONNX Runtime's C# API wraps every error in "[ErrorCode:X]"; its executor's kernel failures, pasted without the
    # "[E:onnxruntime" prefix, start "Non-zero status code returned while running"
    r"\[ErrorCode:\w+\]|Non-zero status code returned|"
    r"onnxruntime_pybind11_state\.[A-Z]\w+\b)",
    re.IGNORECASE,
)
# glog's error records ("E1206 04:25:00.1 ..."): no literal to pre-check, so apart from _ERRORISH
_GLOG_ERROR = re.compile(r"\bE\d{4} ", re.IGNORECASE)
# errors no level marker flags, in any engine's words: an exception class named anywhere on the line ("...
# [ShapeInferenceError] ...", "an instance of 'nvinfer1::MyelinError'", "OnnxRuntimeException"; case-sensitive, so
# "on_error" or "max_error" are not names), a C++ exception thrown with its text (DirectML's `Exception "The
# parameter is incorrect."`), a C++ exception nobody caught ("terminate called after throwing an instance of
# 'std::runtime_error'" and its "what():" line), ONNX Runtime's own error/fatal records ("[E:onnxruntime:,
# inference_session.cc:1587 ...]"), "fails with"/"Fail to", and a process a fatal signal ended ("Shard process was
# signaled to shutdown with signal 11", "Worker ... was terminated due to signal 9", "Segmentation fault"): a normal
# stop (SIGTERM, SIGINT, signal 15/2) is not one
_EXCEPTION_NAMED = re.compile(
    r"(?<![\w-])[A-Z][A-Za-z0-9]{0,60}(?:Error|Exception)\b(?![-=])|\bunknown exception\b|\bException [\"'(]|"
    r"terminate called after throwing|^\s*what\(\):|\[[EF]:onnxruntime\b|"
    r"\b[Ff]ails (?:with|on|to|because|when|at|for)\b|\b[Ff]ail to\b"
)
_FATAL_SIGNAL = re.compile(
    r"\bsignal:? (?:4|6|7|8|9|11)\b|\bSIG(?:SEGV|ABRT|ILL|BUS|FPE|KILL)\b|\bSegmentation fault\b|"
    r"\bIllegal instruction\b|\bBus error\b|\bFloating point exception\b",
    re.IGNORECASE,
)
_NOT_ERROR = re.compile(r"\b(0 errors?|no errors?|without errors?|error_count=0|errors?: 0)\b", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WARNISH = re.compile(r"\[W\]|\b[A-Z]\w*Warning\b")  # engine warnings: TracerWarning, UserWarning, [TRT] [W]
LEARNED_ONLY_SIMILARITY = 0.3  # a line no error marker flags needs a closer known case
# wording of problems that are not always flagged as errors (a warning, a bare message): known cases decide
_PROBLEMISH = re.compile(
    r"invalid|mismatch|expected|unexpected|exceed|larger than|longer than|insufficient|incompatible|not enough|"
    r"no available|unable|undefined symbol|does not|cannot|could not|not found|killed|\bmust be\b",
    re.IGNORECASE,
)


@dataclass
class _Event:
    line_no: int
    head: str
    window: str
    in_traceback: bool


class _Lines:
    """The lines of a log read on demand from an iterator, holding only those not yet released: the
    events are found looking a few lines ahead, so a log of any length is read in bounded memory."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._it: Iterator[str] = iter(lines)
        self._held: list[str] = []
        self._base = 0  # the number of the first held line (0-based)
        self._done = False

    def has(self, k: int) -> bool:
        """Whether the log has a line ``k`` (reading up to it)."""
        while not self._done and k >= self._base + len(self._held):
            try:
                self._held.append(next(self._it))
            except StopIteration:
                self._done = True
        return k < self._base + len(self._held)

    def __getitem__(self, k: int) -> str:
        return self._held[k - self._base]

    def release(self, k: int) -> None:
        """Lines before ``k`` are not needed any more."""
        if k - self._base >= 1024:  # dropped in blocks: del of a list's head moves what stays
            del self._held[: k - self._base]
            self._base = k

    @property
    def read(self) -> int:
        return self._base + len(self._held)


def _events(lines: _Lines) -> Iterable[_Event]:
    i = 0
    announced: _Event | None = None  # the line announcing a traceback: the error if the traceback is cut off
    while lines.has(i):
        lines.release(i)
        line = lines[i]
        tb = _TRACEBACK.search(line)
        if tb:
            prefix = line[: tb.start()]  # e.g. "[rank0]: " put before every line by a launcher

            def strip(text: str, prefix: str = prefix) -> str:
                return text[len(prefix) :] if prefix and text.startswith(prefix) else text

            j = i + 1
            while lines.has(j) and (
                _FRAME.match(strip(lines[j])) or _TRACEBACK.search(lines[j]) or _CHAIN.match(strip(lines[j]))
            ):
                lines.release(j)  # a deep recursion's frames are scanned, not kept
                j += 1
            if lines.has(j):
                # the final exception line, plus continuation lines of its message
                k = j + 1
                while (
                    lines.has(k) and k - j <= _LOOKAHEAD and lines[k].strip() and not _looks_like_new_record(lines[k])
                ):
                    k += 1
                yield _Event(j + 1, strip(lines[j]), "\n".join(strip(lines[x]) for x in range(j, k)), True)
                announced = None
                i = k
                continue
            if announced is not None:  # the paste ends inside the traceback: what announced it is all there is
                yield announced
                announced = None
            i = j
            continue
        announced = None
        if (
            lines.has(i + 1) and _TRACEBACK.search(lines[i + 1]) and not _any_rule(line)
        ):  # "ERROR ... inference failed" announcing the traceback below: the traceback says what failed
            announced = _Event(i + 1, line, line, False)
            i += 1
            continue
        k = i + 1  # the message may go on below (values, wrapped text), up to the next log record
        while lines.has(k) and k - i <= _LOOKAHEAD and not _looks_like_new_record(lines[k]):
            k += 1
        yield _Event(i + 1, line, "\n".join(lines[x] for x in range(i, k)), False)
        i += 1


def _looks_like_new_record(line: str) -> bool:
    return bool(re.match(r"^(\d{4}-\d\d-\d\d|\[?\d\d[:/]\d\d|[IWEF]\d{4} |INFO|WARNING|ERROR|DEBUG|\[)", line))


_GATE = RuleGate([r.pattern for r in RULES])


def _rules_for(window: str) -> Iterable[LogRule]:
    """The rules, in order, that may match ``window`` (the others lack a literal their regex needs)."""
    return (RULES[i] for i in _GATE.candidates(fold(window)))


def _any_rule(line: str) -> bool:
    return any(_match(r, line, line) for r in _rules_for(line))


def _match(rule: LogRule, head: str, window: str) -> re.Match[str] | None:
    m = rule.pattern.search(window)
    if m is None or m.start() >= len(head):
        return None
    return m


def classify_line(
    text: str, source: str = "<log>", line_no: int | None = None, *, index: CaseIndex | None = None
) -> Finding | None:
    """Classify one error message (which may span a few lines); None if it is not an error."""
    head = text.splitlines()[0] if text else ""
    return _classify(_Event(line_no or 1, head, text, False), source, index)


@cache
def default_index() -> CaseIndex | None:
    """The index over the packaged corpus; None when scikit-learn (``usg[doctor]``) is not installed."""
    from usg.doctor.logs.index_cache import cached_default_index
    from usg.errors import MissingDependency

    try:
        return cached_default_index()
    except MissingDependency:
        return None


def _classify(ev: _Event, source: str, index: CaseIndex | None) -> Finding | None:
    head = _ANSI.sub("", ev.head)
    window = _ANSI.sub("", ev.window)
    for rule in _rules_for(window):
        m = _match(rule, head, window)
        if m is None:
            continue
        ex = rule.explain(m)
        if ex is None:  # the wording matched but does not name a cause: other rules, then known cases
            continue
        evidence = {k: v for k, v in ex.evidence.items() if v is not None}
        evidence["line_text"] = head.strip()[:400]
        evidence["confidence"] = RULE_CONFIDENCE
        if index is not None:
            evidence["similar_cases"] = [n.to_dict() for n in index.nearest(window, 3)]
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
    folded = fold(head)
    if not head.strip() or screen(_NOT_ERROR, head, folded):
        return None
    if (
        ev.in_traceback
        or screen(_ERRORISH, head, folded)
        or _GLOG_ERROR.search(head)
        or (  # an engine warning that names an exception ("... will raise a ValueError") stays a warning
            (screen(_EXCEPTION_NAMED, head, folded) or screen(_FATAL_SIGNAL, head, folded))
            and not screen(_WARNISH, head, folded)
        )
    ):
        return _unmatched(ev, head, window, source, index)
    if index is not None and (screen(_WARNISH, head, folded) or screen(_PROBLEMISH, head, folded)):
        return _learned_only(ev, head, window, source, index)
    return None


def _is_cascade(line: str) -> bool:
    """A line that states a consequence: a generic cascade ("failed to load all models"), or how a process
    died (a fatal signal: "signaled to shutdown with signal 11", "Segmentation fault"), which says nothing of
    why (a segfault may be a kernel, a driver or an unsupported model; SIGILL, which a rule reads, is the
    exception)."""
    return _CASCADE.search(line) is not None or _FATAL_SIGNAL.search(line) is not None


def _learned_only(ev: _Event, head: str, window: str, source: str, index: CaseIndex) -> Finding | None:
    """A warning or a bare problem statement: reported only when known cases recognise it."""
    f = _unmatched(ev, head, window, source, index)
    near = f.evidence.get("similar_cases") or [{}]
    if f.code != LEARNED.code or near[0].get("similarity", 0) < LEARNED_ONLY_SIMILARITY:
        return None
    if _WARNISH.search(head):  # an engine warning stays a warning, whatever its class
        return replace(f, severity=Severity.WARNING)
    return f


def _unmatched(ev: _Event, head: str, window: str, source: str, index: CaseIndex | None) -> Finding:
    """An error line no rule knows: the learned layer's class if known cases are close, else LOG000."""
    ev_head: dict[str, Any] = {"line_text": head.strip()[:400]}
    hint = "" if index is not None else " (pip install 'usg[doctor]' to match it against known real-world cases)"
    if index is not None and _is_cascade(head):  # "failed to load all models": a consequence, no cause to guess
        ev_head["cascade"] = True
    elif index is not None and _GENERIC_EXCEPTION.search(head) and not any(vocab_vector(window)):
        ev_head["generic_exception"] = True  # "KeyError: 'x'": where the code broke, not why
        ev_head["similar_cases"] = [n.to_dict() for n in index.nearest(window, 3)]
    elif index is not None:
        from usg.doctor.logs.similar import causal_line, message_evidence

        pred = index.predict(window)
        near = [n.to_dict() for n in pred.neighbours]
        if pred.root_cause is not None:
            line = causal_line(window) or head.strip()
            best = pred.neighbours[0]
            return finding(
                LEARNED,
                f"{line[:300]} — like {len(pred.neighbours)} known case(s) of {pred.root_cause.value} "
                f"(confidence {pred.confidence:.2f}; nearest: {best.case.url})",
                Location(source, line=ev.line_no),
                f"{_FIXES.get(pred.root_cause, 'see the nearest known cases')}; the nearest known case was "
                f"resolved by: {best.case.resolution}",
                {**ev_head, **message_evidence(line), "confidence": pred.confidence, "similar_cases": near},
                stage=Stage.LOGS,
                root_cause=pred.root_cause,
            )
        ev_head.update(confidence=pred.confidence, similar_cases=near)
        if pred.candidates:  # known, with several causes: say which, and how each was resolved
            ev_head["candidate_causes"] = [c.value for c in pred.candidates]
            ways = "; ".join(f"{n.case.root_cause.value}: {n.case.resolution} ({n.case.url})" for n in pred.neighbours)
            return finding(
                "LOG000",
                f"unclassified error: {head.strip()[:300]} — known cases of this message had different causes "
                f"({', '.join(ev_head['candidate_causes'])})",
                Location(source, line=ev.line_no),
                "the message alone does not tell which cause applies here (the versions installed, the build or the "
                f"configuration decide it); check each against your setup — {ways}",
                ev_head,
                stage=Stage.LOGS,
            )
    return finding(
        "LOG000",
        f"unclassified error: {head.strip()[:300]}",
        Location(source, line=ev.line_no),
        "no rule or known case matches this message; read the surrounding log lines (and report the message to "
        "extend the rules)" + hint,
        ev_head,
        stage=Stage.LOGS,
    )


def root_error(findings: Iterable[Finding]) -> Finding | None:
    """The first root error: the earliest classified error that is not a generic cascade line.

    A finding is classified when it names a root cause: LOG000, and a rule that recognises a message
    whose cause the message does not state (TensorRT's "no implementation for node"), are not. A
    learned guess that comes after such an error (or after an error statement the learned layer left
    unclassified, not a head line ending in ":") is a guess about what followed it ("Failed to create
    executable" after "Failed to compile network ... Compilation failed"): the earlier error is the root.
    Errors come before warnings (a warning is the root only in a log without errors); without a
    classified one, the earliest unclassified error; None for a log without problems.
    """
    ranked = sorted(findings, key=lambda f: (f.severity is not Severity.ERROR, f.location.line or 0))
    errors = [f for f in ranked if f.severity in (Severity.ERROR, Severity.WARNING)]
    recognised = None  # an earlier error a rule knows but whose cause the message does not state
    unknown = None  # an earlier error statement neither a rule nor the known cases could classify
    for f in errors:
        text = str(f.evidence.get("line_text", ""))
        cascade = f.code in ("LOG000", LEARNED.code) and _is_cascade(text)
        if f.root_cause is not RootCause.UNCLASSIFIED and not cascade:
            if f.code == LEARNED.code and recognised is not None:
                return recognised  # a guess about what followed it does not name its cause either
            below = _rule_below(f, errors)
            after_unknown = unknown is not None and (unknown.location.line or 0) < (f.location.line or 0)
            if below is None and f.code == LEARNED.code and after_unknown:
                return unknown  # so does a guess about what followed an error left unclassified
            return below or f
        if recognised is None and f.code != "LOG000" and f.severity is Severity.ERROR:
            recognised = f
        # an error statement left unclassified; not a head line ending in ":" ("In function parseGraph:",
        # "Exception from src/inference/src/core.cpp:116:"), whose lines below state the error
        head = text.rstrip().endswith(":")
        if unknown is None and f.code == "LOG000" and f.severity is Severity.ERROR and not cascade and not head:
            unknown = f
    return errors[0] if errors else None


def _rule_below(f: Finding, errors: list[Finding]) -> Finding | None:
    """A rule's finding within the few lines after a learned one: the same message, read by a rule.

    Engines print a head line and state the cause below it ("ERROR: ModelImporter.cpp:134 In function
    parseGraph:" then "[8] No importer registered for op: Mish"): the head alone is what the learned
    layer guessed from, the line below is what a rule recognises — and rules are the precise reading.
    """
    if f.code != LEARNED.code or f.location.line is None:
        return None
    for g in errors:
        line = g.location.line
        if (
            g.code not in ("LOG000", LEARNED.code)
            and g.severity is f.severity
            and g.root_cause is not RootCause.UNCLASSIFIED
            and line is not None
            and f.location.line < line <= f.location.line + _LOOKAHEAD + 1
        ):
            return g
    return None


def classify_text(
    text: str,
    source: str = "<log>",
    *,
    index: CaseIndex | None = None,
    learned: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> list[Finding]:
    """Every classified error of a log, in order of first appearance, repeats merged (``evidence.count``).

    ``index`` is the labelled-case index of the learned layer (default: the packaged corpus);
    ``learned=False`` keeps the signature rules only. The root error is marked ``evidence.root_error``.
    ``progress(lines_read, lines)`` is called every :data:`PROGRESS_EVERY` lines of a long log.
    Lines longer than :data:`~usg.doctor.logs.reader.MAX_LINE_CHARS` are read by their beginning and end
    (:func:`~usg.doctor.logs.reader.bounded`).
    """
    lines = text.splitlines()
    total = len(lines)
    return classify_lines(
        (bounded(line) for line in lines),
        source,
        index=index,
        learned=learned,
        progress=None if progress is None else (lambda done, _: progress(done, total)),
    )


def classify_lines(
    lines: Iterable[str],
    source: str = "<log>",
    *,
    index: CaseIndex | None = None,
    learned: bool = True,
    progress: Callable[[int, int | None], None] | None = None,
) -> list[Finding]:
    """:func:`classify_text` on a log given as lines (already cut by
    :func:`~usg.doctor.logs.reader.bounded`, as :class:`~usg.doctor.logs.reader.LogReader` gives them), read
    once and in bounded memory: only the few lines the current message spans are held.
    ``progress(lines_read, None)`` is called every :data:`PROGRESS_EVERY` lines, ``progress(lines, lines)`` at
    the end.
    """
    idx = (index or default_index()) if learned else None
    window = _Lines(lines)
    merged: dict[tuple[str, str], Finding] = {}
    seen: dict[tuple[str, str], tuple[int, list[int]]] = {}  # times seen, and the first 20 line numbers
    next_report = PROGRESS_EVERY
    for ev in _events(window):
        if progress is not None and ev.line_no >= next_report:
            progress(ev.line_no, None)
            next_report = ev.line_no + PROGRESS_EVERY
        f = _classify(ev, source, idx)
        if f is None:
            continue
        values = {k: v for k, v in f.evidence.items() if k not in ("line_text", "similar_cases", "confidence")}
        key = (f.code, repr(sorted(values.items())) if values else f.evidence.get("line_text", ""))
        if f.code in ("LOG000", LEARNED.code):
            key = (f.code, _normalise(f.evidence["line_text"]))
        if key in merged:
            count, first = seen[key]
            if len(first) < 20:
                first.append(ev.line_no)
            seen[key] = (count + 1, first)
            continue
        merged[key] = f
        seen[key] = (1, [ev.line_no])
    if progress is not None:
        progress(window.read, window.read)
    out: list[Finding] = []
    for key, f in merged.items():
        count, first = seen[key]
        if count > 1:
            f = replace(
                f,
                message=f.message + f" (seen {count} times)",
                evidence={**f.evidence, "count": count, "lines": first},
            )
        out.append(f)
    root = root_error(out)
    return [replace(f, evidence={**f.evidence, "root_error": True}) if f is root else f for f in out]


def _normalise(line: str) -> str:
    """Drop timestamps, pids and addresses so repeats of one message merge."""
    line = re.sub(r"^\S*\d{2}:\d{2}:\d{2}[\d.,]*\S*\s*", "", line)
    line = re.sub(r"0x[0-9a-f]+|\b\d+\b", "#", line, flags=re.IGNORECASE)
    return line.strip()
