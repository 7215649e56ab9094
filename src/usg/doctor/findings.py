"""The doctor's unit of output: a :class:`Finding`.

A finding says what is wrong (``code``, ``message``), how bad (``severity``),
why in the field's vocabulary (``root_cause``), where (``location``), the
numbers that prove it (``evidence``) and one concrete ``fix``. ``stage`` says
how it was caught: statically, by a dry run / parity run, or only from logs —
the root-cause matrix in every report is built from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Location", "RootCause", "Severity", "Stage"]


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


class RootCause(enum.StrEnum):
    DTYPE_OR_RANGE = "dtype_or_range"
    SHAPE_OR_RANK = "shape_or_rank"
    BATCH_DIM_CONFIG = "batch_dim_config"
    DYNAMIC_SHAPE_FIXED = "dynamic_shape_fixed"
    UNSUPPORTED_OP = "unsupported_op"
    OP_SEMANTIC_DRIFT = "op_semantic_drift"
    MEMORY = "memory"
    VERSION_COUPLING = "version_coupling"
    CONFIG_INVALID = "config_invalid"
    ENVIRONMENT = "environment"
    UNCLASSIFIED = "unclassified"


class Stage(enum.StrEnum):
    """How a finding was caught."""

    STATIC = "static"
    DRY_RUN = "dry_run"
    PARITY = "parity"
    LOGS = "logs"


@dataclass(frozen=True)
class Location:
    """Where a finding points: a file, and optionally a node/field inside it and a line/column."""

    file: str
    element: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        out = self.file
        if self.line is not None:
            out += f":{self.line}"
            if self.column is not None:
                out += f":{self.column}"
        if self.element:
            out += f" [{self.element}]"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    root_cause: RootCause
    message: str
    location: Location
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    stage: Stage = Stage.STATIC

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "root_cause": self.root_cause.value,
            "stage": self.stage.value,
            "message": self.message,
            "location": self.location.to_dict(),
            "evidence": self.evidence,
            "fix": self.fix,
        }
