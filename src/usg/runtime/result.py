"""What a request returns, and its JSON form (the one ``usg run --json`` and HTTP print)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.errors import BackendError

__all__ = ["InferResult", "to_jsonable"]


_PLAIN = frozenset({str, int, float, bool, type(None)})


def to_jsonable(value: Any, where: str = "output") -> Any:
    """Arrays become (nested) lists, numpy scalars Python numbers; dicts and lists recurse. Anything
    JSON cannot carry (an object, a set, an object array of them) is a :class:`BackendError` naming
    where it sits (``where``: the output's name) — not a serializer's TypeError after the request ran."""
    if type(value) in _PLAIN:  # exact types: numpy's float64 (a float subclass) is not plain
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value.tolist())]
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (str, int, float)):  # subclasses (an IntEnum, a str subclass)
        return value
    raise BackendError(
        f"{where} is a {type(value).__name__}, which JSON cannot carry; fix: return numbers, text, lists, dicts "
        "or numpy arrays from the node that makes it"
    )


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
