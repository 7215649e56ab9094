"""The one exception tree of USG.

Split by what the caller can do about it::

    USGError
    ├── GraphError            fix the graph file (collects every problem, raised once)
    ├── InputError            fix the request input            (HTTP 400)
    │   ├── ContractError     a tensor breaks a model's contract (HTTP 422)
    │   └── PayloadTooLarge   body or image above a limit       (HTTP 413)
    ├── BackendError          a model or function failed        (HTTP 500)
    │   └── DeferredValueRead a value deferred to a remote model was read here
    ├── RequestTimeout        the request ran past its deadline (HTTP 504)
    ├── Overloaded            retry later; carries retry_after  (HTTP 429 / 503)
    ├── StateError            the executor/server is not in a state to do this (HTTP 503)
    │   └── ReplicaUnavailable  a remote model replica died and retries ran out (HTTP 503)
    ├── MissingDependency     an optional extra is not installed; says the pip line
    └── UsageError            a CLI/API argument is wrong (exit code 2)

Every message says what happened, the values involved, and the fix.
Serving errors carry ``status`` so the HTTP layer maps them without guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BackendError",
    "ContractError",
    "DeferredValueRead",
    "FixableError",
    "GraphError",
    "GraphProblem",
    "InputError",
    "MissingDependency",
    "Overloaded",
    "PayloadTooLarge",
    "ReplicaUnavailable",
    "RequestTimeout",
    "StateError",
    "USGError",
    "UsageError",
]


class USGError(Exception):
    """Base of every error USG raises on purpose."""

    status: int = 500
    reason: str = "error"
    #: the graph node that raised it (set by the executor; HTTP error bodies carry it)
    node: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"error": self.reason, "message": str(self)}


@dataclass(frozen=True)
class GraphProblem:
    """One problem found while building a graph: where, what, and the fix."""

    where: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}\n    fix: {self.fix}"


class GraphError(USGError):
    """The graph file (or builder calls) describe a graph that cannot run.

    Carries every problem found, so one edit round fixes them all.
    """

    status = 500
    reason = "graph_invalid"

    def __init__(self, problems: Sequence[GraphProblem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        head = f"graph {source!r} is invalid" if source else "graph is invalid"
        n = len(self.problems)
        body = "\n".join(f"  {i}. {p}" for i, p in enumerate(self.problems, 1))
        super().__init__(f"{head}: {n} problem{'s' if n != 1 else ''}\n{body}")

    def to_dict(self) -> dict[str, object]:
        return {
            "error": self.reason,
            "message": str(self),
            "problems": [{"where": p.where, "message": p.message, "fix": p.fix} for p in self.problems],
        }


class FixableError(USGError):
    """An error whose message and fix travel apart: ``str()`` reads "MESSAGE; fix: FIX", JSON bodies and
    stream events carry ``message`` (without the fix) and ``fix`` in their own fields."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        self.fix = fix
        self.detail = message
        super().__init__(message if fix is None else f"{message}; fix: {fix}")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"error": self.reason, "message": self.detail}
        if self.fix is not None:
            out["fix"] = self.fix
        return out


class InputError(FixableError):
    """A request input is missing, malformed or of the wrong kind."""

    status = 400
    reason = "bad_input"

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.field = field
        super().__init__(message, fix)

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        if self.field is not None:
            out["field"] = self.field
        return out


class ContractError(InputError):
    """A tensor reaching a model input breaks its declared contract (dtype, rank, dims, range)."""

    status = 422
    reason = "contract_violation"


class PayloadTooLarge(InputError):
    """The request body or an image is above a configured limit."""

    status = 413
    reason = "payload_too_large"


class BackendError(USGError):
    """A model session or a Python node function failed while running."""

    status = 500
    reason = "backend_error"


class DeferredValueRead(BackendError):
    """Code in this process read the values of a placeholder: an array the executor did not compute
    because only remote models were to read it (:func:`usg.ops.wire.derived` inside
    :func:`usg.ops.wire.deferring`; :mod:`usg.runtime.deferral`). Its shape and dtype are real,
    its values are not: the message names the node and port it came from and the fix."""

    reason = "deferred_value_read"


class RequestTimeout(USGError):
    """The request did not finish before its deadline."""

    status = 504
    reason = "timeout"


class Overloaded(FixableError):
    """Capacity is exhausted; the caller should retry after ``retry_after`` seconds."""

    status = 429
    reason = "overloaded"

    def __init__(
        self, message: str, *, retry_after: float = 1.0, why: str = "queue_full", fix: str | None = None
    ) -> None:
        self.retry_after = retry_after
        self.why = why
        super().__init__(message, fix)


class StateError(USGError):
    """The object is not in a lifecycle state that allows this call (e.g. closed, draining)."""

    status = 503
    reason = "unavailable"


class ReplicaUnavailable(StateError):
    """A model's remote replicas (Ray Serve) failed the call and the retries ran out; retry later."""

    reason = "replica_unavailable"


class MissingDependency(USGError):
    """An optional dependency is missing; the message names the exact pip line."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{purpose} needs the Python package {module!r}, which is not installed; fix: pip install 'usg[{extra}]'"
        )


class UsageError(USGError):
    """A command-line or API argument is wrong; maps to exit code 2."""

    status = 400
    reason = "usage"
