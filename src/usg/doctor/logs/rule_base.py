"""The pieces every log rule is made of: :class:`LogRule`, :class:`Explained`, and the registering decorator.

The rules of ``usg doctor logs``: one regex per known error message, with what it means and the fix.

Patterns are written from messages users actually reported (Triton server/client, ONNX Runtime,
torch.onnx, TensorRT/trtexec, vLLM, transformers, CUDA). A rule's ``pattern`` must match on the
error line itself; it may read values from the next few lines (ONNX Runtime puts
``index: 0 Got: 32 Expected: 1`` below its head line). ``explain`` turns the match into the
message, the fix and the evidence; it may refine the root cause (a byte-size ratio of 4 is a
dtype problem, a ratio of 3 a layout problem), or return None when the matched wording does not
say enough to name a cause (the line then goes on to the next rules and the learned layer).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from usg.doctor.findings import RootCause, Severity

__all__ = ["Explained", "LogRule", "R", "rules"]

R = RootCause


@dataclass(frozen=True)
class Explained:
    message: str
    fix: str
    evidence: dict[str, Any]
    root_cause: RootCause | None = None
    severity: Severity | None = None


@dataclass(frozen=True)
class LogRule:
    code: str
    system: str
    title: str
    root_cause: RootCause
    severity: Severity
    pattern: re.Pattern[str]
    explain: Callable[[re.Match[str]], Explained | None]
    also: tuple[RootCause, ...] = ()  # root causes ``explain`` may refine to, from the numbers it reads


_RULES: list[LogRule] = []


def _rule(
    code: str,
    system: str,
    title: str,
    cause: RootCause,
    pattern: str,
    sev: Severity = Severity.ERROR,
    also: tuple[RootCause, ...] = (),
) -> Any:
    def deco(fn: Callable[[re.Match[str]], Explained | None]) -> Callable[[re.Match[str]], Explained | None]:
        compiled = re.compile(pattern, re.IGNORECASE | re.DOTALL)
        _RULES.append(LogRule(code, system, title, cause, sev, compiled, fn, also))
        return fn

    return deco


def rules() -> tuple[LogRule, ...]:
    """Every registered rule, in registration order (the first match wins)."""
    return tuple(_RULES)
