"""The registry of doctor checks.

Each check is a pure function registered with :func:`check`; it declares the
codes it may emit (documented by ``usg doctor --list-checks``) and the target
kind it runs on. Check modules import this and decorate; the doctor runs every
check registered for a target's kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from usg.doctor.findings import Finding, RootCause, Severity

__all__ = ["CheckInfo", "CodeInfo", "all_codes", "check", "checks_for"]


@dataclass(frozen=True)
class CodeInfo:
    """Documentation of one finding code."""

    code: str
    severity: Severity
    root_cause: RootCause
    title: str
    explanation: str


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
        _CODES.setdefault(info.code, info)


def checks_for(target: str) -> list[CheckInfo]:
    return [c for c in _CHECKS if c.target == target]


def all_codes() -> list[CodeInfo]:
    return sorted(_CODES.values(), key=lambda c: c.code)
