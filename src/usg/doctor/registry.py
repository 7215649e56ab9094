"""The registry of doctor checks.

Each check is a pure function registered with :func:`check`; it declares the
codes it may emit (documented by ``usg doctor --list-checks``) and the target
kind it runs on. Check modules import this and decorate; the doctor runs every
check registered for a target's kind.

Findings are built from the registry with :func:`finding`: the code alone fixes the
severity, the root cause and the title, so a check cannot emit a code at a severity
or cause nobody registered. A code whose severity legitimately depends on the
deploy target (e.g. an error only when deploying to TensorRT) registers that
alternative in ``CodeInfo.also_severities``; a log rule whose cause depends on the
numbers in the message registers ``also_root_causes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage

__all__ = ["CheckInfo", "CodeInfo", "all_codes", "check", "checks_for", "code_info", "finding", "register_codes"]


@dataclass(frozen=True)
class CodeInfo:
    """Documentation of one finding code."""

    code: str
    severity: Severity
    root_cause: RootCause
    title: str
    explanation: str
    also_severities: tuple[Severity, ...] = ()
    also_root_causes: tuple[RootCause, ...] = ()

    def severities(self) -> tuple[Severity, ...]:
        return (self.severity, *self.also_severities)

    def root_causes(self) -> tuple[RootCause, ...]:
        return (self.root_cause, *self.also_root_causes)


@dataclass(frozen=True)
class CheckInfo:
    name: str
    target: str  # "onnx", "triton_model", "triton_repo", "graph", "hf_model", "logs", ...
    codes: tuple[CodeInfo, ...]
    func: Callable[..., Iterable[Finding]]


_CHECKS: list[CheckInfo] = []
_CODES: dict[str, CodeInfo] = {}

F = TypeVar("F", bound=Callable[..., Any])


def check(target: str, codes: Iterable[CodeInfo]) -> Callable[[F], F]:
    """Register ``func`` as a check for ``target`` that may emit ``codes``."""
    code_list = tuple(codes)

    def deco(func: F) -> F:
        for info in code_list:
            prev = _CODES.get(info.code)
            if prev is not None and prev != info:
                raise RuntimeError(f"doctor code {info.code} registered twice with different meanings")
            _CODES[info.code] = info
        _CHECKS.append(CheckInfo(func.__name__, target, code_list, func))
        return func

    return deco


def register_codes(codes: Iterable[CodeInfo]) -> None:
    """Document codes emitted outside a registered check (e.g. by log rules)."""
    for info in codes:
        prev = _CODES.get(info.code)
        if prev is not None and prev != info:
            raise RuntimeError(f"doctor code {info.code} registered twice with different meanings")
        _CODES[info.code] = info


def code_info(code: str) -> CodeInfo:
    """The registered :class:`CodeInfo` of ``code``; a code nobody registered is a programming error."""
    try:
        return _CODES[code]
    except KeyError:
        raise LookupError(
            f"doctor code {code!r} is not registered; register it with @check or register_codes"
        ) from None


def finding(
    code: str | CodeInfo,
    message: str,
    where: Location,
    fix: str,
    evidence: dict[str, Any] | None = None,
    *,
    stage: Stage = Stage.STATIC,
    severity: Severity | None = None,
    root_cause: RootCause | None = None,
) -> Finding:
    """Build a :class:`Finding` whose severity and root cause come from the registry.

    ``severity`` / ``root_cause`` may only pick one of the alternatives the code registered
    (:attr:`CodeInfo.also_severities`, :attr:`CodeInfo.also_root_causes`); anything else raises.
    """
    info = code_info(code if isinstance(code, str) else code.code)
    if not isinstance(code, str) and code != info:
        raise RuntimeError(f"doctor code {info.code}: the CodeInfo given differs from the registered one")
    sev = severity or info.severity
    if sev not in info.severities():
        raise ValueError(f"doctor code {info.code} is registered as {info.severity.value}, not {sev.value}")
    cause = root_cause or info.root_cause
    if cause not in info.root_causes():
        raise ValueError(
            f"doctor code {info.code} is registered with root cause {info.root_cause.value}, not {cause.value}"
        )
    return Finding(info.code, sev, cause, message, where, fix, dict(evidence or {}), stage)


def checks_for(target: str) -> list[CheckInfo]:
    return [c for c in _CHECKS if c.target == target]


def all_codes() -> list[CodeInfo]:
    return sorted(_CODES.values(), key=lambda c: c.code)
