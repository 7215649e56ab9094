"""What a request returns, and its JSON form (the one ``usg run --json`` and HTTP print)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.errors import BackendError

__all__ = ["InferResult", "to_jsonable"]


_PLAIN = frozenset({str, int, float, bool, type(None)})


def to_jsonable(value: Any, where: str = "output") -> Any:
    """Arrays become (nested) lists, numpy scalars Python numbers, bytes text; dicts and lists recurse.
    Anything JSON cannot carry (an object, a set, a complex number, a date) is a :class:`BackendError`
    naming where it sits (``where``: the output's name, then ``.key`` / ``[i]``) — not a serializer's
    TypeError after the request ran. Runs on every answer: the path is only built for the error."""
    try:
        return _jsonable(value)
    except _NotJSON as exc:
        raise BackendError(
            f"{where}{''.join(reversed(exc.path))} is a {exc.kind}, which JSON cannot carry; fix: return "
            "numbers, text, lists, dicts or numpy arrays from the node that makes it"
        ) from None


class _NotJSON(Exception):
    """A value JSON cannot carry; ``path`` gathers its ``.key`` / ``[i]`` steps, innermost first."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.kind = type(value).__name__
        self.path: list[str] = []


def _jsonable(value: Any) -> Any:
    if type(value) in _PLAIN:  # exact types: numpy's float64 (a float subclass) is not plain
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in _NUMBER_KINDS:
            return value.tolist()
        return _items(value.tolist())  # text, bytes, objects, complex, dates: item by item
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            try:
                out[str(k)] = v if type(v) in _PLAIN else _jsonable(v)
            except _NotJSON as exc:
                exc.path.append(f".{k}")
                raise
        return out
    if isinstance(value, (list, tuple)):
        return _items(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (str, int, float)):  # subclasses (an IntEnum, a str subclass)
        return value
    raise _NotJSON(value)


def _items(values: list[Any] | tuple[Any, ...]) -> list[Any]:
    try:
        return [v if type(v) in _PLAIN else _jsonable(v) for v in values]
    except _NotJSON as exc:  # the error path only: find the item's index
        for i, v in enumerate(values):
            try:
                _jsonable(v)
            except _NotJSON:
                exc.path.append(f"[{i}]")
                break
        raise


_NUMBER_KINDS = frozenset("biuf")


@dataclass(frozen=True)
class InferResult:
    """Outputs of one request (absent outputs are not keys), the pruned nodes, and per-node wall time."""

    outputs: dict[str, Any]
    pruned_nodes: list[str] = field(default_factory=list)
    node_ms: dict[str, float] = field(default_factory=dict)
    request_id: str = ""
    # "sha256:<hex>" of each graph input as received (its bytes; a text's UTF-8; an array's
    # dtype, shape and bytes) — what the client can check it sent
    integrity: dict[str, str] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "outputs": {name: to_jsonable(v, f"output {name!r}") for name, v in self.outputs.items()},
            "pruned_nodes": list(self.pruned_nodes),
            "node_ms": {k: round(v, 3) for k, v in self.node_ms.items()},
            "integrity": dict(self.integrity),
        }
