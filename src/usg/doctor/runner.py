"""Run the registered doctor checks on paths and collect their findings.

The runner is the only place that knows which modules hold checks
(:data:`CHECK_MODULES`); a module that does not exist yet is skipped. For each
path it detects the targets (:mod:`usg.doctor.detect`), loads each target once
into the *subject* its checks read (an ONNX model, a parsed ``config.pbtxt``...),
and calls every check registered for the target's kind. A check that raises is
reported as a ``DOCTOR001`` finding instead of stopping the run.
"""

from __future__ import annotations

import importlib
import inspect
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.doctor.detect import Target, detect_targets
from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.registry import CodeInfo, checks_for, finding, register_codes
from usg.errors import UsageError

__all__ = [
    "CHECK_MODULES",
    "CODE_DOC_MODULES",
    "CheckContext",
    "DoctorReport",
    "check_target",
    "load_check_modules",
    "parse_targets",
    "run_doctor",
]

# Modules that register checks, imported by name; missing ones are skipped.
CHECK_MODULES: tuple[str, ...] = (
    "usg.doctor.onnx.checks",
    "usg.doctor.onnx.semantics",
    "usg.doctor.onnx.runtime_compat",
    "usg.doctor.onnx.quantized",
    "usg.doctor.triton.checks",
    "usg.doctor.triton.crosscheck",
    "usg.doctor.triton.ensemble",
    "usg.doctor.graph.checks",
    "usg.doctor.graph.pad_safety",
    "usg.doctor.graph.llm_budget",
    "usg.doctor.hf.coupling",
)

# Modules that only document codes they emit outside path checks (log rules, parity runs).
CODE_DOC_MODULES: tuple[str, ...] = ("usg.doctor.logs.classify", "usg.doctor.parity.run")

# target kind -> "module:function" that turns a path into the subject the checks read.
_LOADERS: dict[str, str] = {
    "onnx": "usg.doctor.onnx.checks:load_onnx",
    "triton_model": "usg.doctor.triton.config:load_triton_model",
}

_TARGET_ALIASES = {"ort": "ort", "onnxruntime": "ort", "tensorrt": "tensorrt", "trt": "tensorrt"}

INTERNAL = CodeInfo(
    "DOCTOR001",
    Severity.WARNING,
    RootCause.UNCLASSIFIED,
    "a check crashed",
    "A doctor check raised an exception on this target; the other checks still ran. "
    "The evidence carries the exception; please report it.",
)
register_codes([INTERNAL])


@dataclass
class CheckContext:
    """What every check may read besides its subject: the deploy targets and a shared cache."""

    targets: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    dry_run: bool = False
    cache: dict[Any, Any] = field(default_factory=dict)
    model_repositories: tuple[Path, ...] = ()  # every Triton repository of the run (ensemble steps resolve across them)

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


@dataclass
class DoctorReport:
    """The findings of one doctor run, with what was checked and how long it took."""

    findings: list[Finding]
    targets: list[Target]
    elapsed_s: float

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity is Severity.WARNING)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0


def load_check_modules(names: Iterable[str] = CHECK_MODULES) -> list[str]:
    """Import the check modules that exist; return the names imported."""
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the module itself is absent: not written yet
                continue
            raise
        loaded.append(name)
    return loaded


_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


def parse_targets(spec: str | None) -> dict[str, tuple[int, ...]]:
    """Parse ``"ort=1.20,tensorrt=10.3"`` into ``{"ort": (1, 20), "tensorrt": (10, 3)}``."""
    out: dict[str, tuple[int, ...]] = {}
    if not spec:
        return out
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, version = part.partition("=")
        key = _TARGET_ALIASES.get(name.strip().lower())
        if not sep or key is None or not _VERSION_RE.match(version.strip()):
            raise UsageError(
                f"--target item {part!r} is not RUNTIME=VERSION; "
                "fix: use e.g. --target ort=1.20,tensorrt=10.3 (runtimes: ort, tensorrt)"
            )
        if key in out:
            raise UsageError(
                f"--target names {key} twice ({part!r} after {key}={'.'.join(map(str, out[key]))}); "
                f"fix: give one version per runtime (check a second {key} release in another run)"
            )
        out[key] = tuple(int(x) for x in version.strip().split("."))
    return out


def _load_subject(target: Target, ctx: CheckContext) -> Any:
    spec = _LOADERS.get(target.kind)
    if spec is None:
        return target.path
    module_name, attr = spec.split(":")
    loader = getattr(importlib.import_module(module_name), attr)
    return loader(target.path, ctx)


def _call(func: Callable[..., Iterable[Finding]], subject: Any, ctx: CheckContext) -> list[Finding]:
    try:
        n_params = len(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        n_params = 2
    return list(func(subject, ctx) if n_params >= 2 else func(subject))


def _crash_finding(target: Target, check_name: str, exc: BaseException) -> Finding:
    return finding(
        INTERNAL,
        message=f"check {check_name} crashed on this {target.kind}: {type(exc).__name__}: {exc}",
        where=Location(str(target.path)),
        fix="report this with the file attached; the other checks' findings are still valid",
        evidence={"check": check_name, "exception": f"{type(exc).__name__}: {exc}"},
        stage=Stage.STATIC,
    )


def check_target(target: Target, ctx: CheckContext) -> list[Finding]:
    """Run every check registered for ``target.kind`` on it."""
    subject = _load_subject(target, ctx)
    findings: list[Finding] = []
    for info in checks_for(target.kind):
        try:
            findings.extend(_call(info.func, subject, ctx))
        except Exception as exc:  # a crashing check must not hide the others
            findings.append(_crash_finding(target, info.name, exc))
    return findings


def run_doctor(
    paths: Sequence[str | Path],
    *,
    targets: Mapping[str, tuple[int, ...]] | str | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int, Target], None] | None = None,
) -> DoctorReport:
    """Check every path; raise :class:`UsageError` for a missing or unknown path before checking any."""
    start = time.perf_counter()
    load_check_modules()
    parsed = parse_targets(targets) if isinstance(targets, str) or targets is None else dict(targets)
    found: list[Target] = []
    seen: set[tuple[str, Path]] = set()
    for raw in paths:
        for t in detect_targets(Path(raw)):
            key = (t.kind, t.path.resolve())
            if key not in seen:
                seen.add(key)
                found.append(t)
    repos = dict.fromkeys(t.path.resolve().parent for t in found if t.kind == "triton_model")
    ctx = CheckContext(targets=parsed, dry_run=dry_run, model_repositories=tuple(repos))
    findings: list[Finding] = []
    for i, target in enumerate(found):
        if progress is not None:
            progress(i, len(found), target)
        findings.extend(check_target(target, ctx))
    if progress is not None and found:
        progress(len(found), len(found), found[-1])
    unique: dict[tuple[str, Location, str], Finding] = {}
    for f in findings:  # a model reached twice (given directly and via a graph/repo) reports once
        unique.setdefault((f.code, f.location, f.message), f)
    findings = list(unique.values())
    findings.sort(key=lambda f: (f.location.file, -f.severity.rank, f.code, f.location.element or ""))
    return DoctorReport(findings=findings, targets=found, elapsed_s=time.perf_counter() - start)
