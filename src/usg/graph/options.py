"""Checks of the model ``options:`` every backend kind shares (the runtime reads them).

``concurrency``: backend calls (batches) of the model in flight at once, a positive integer
(default 1). ``call_timeout_ms``: the deadline of one backend call, a positive number of
milliseconds (default: none). Other options belong to the backend kind and pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usg.errors import GraphProblem

__all__ = ["model_option_problems"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def model_option_problems(where: str, options: Mapping[str, Any]) -> list[GraphProblem]:
    """Problems with the shared options of the model at ``where`` (``models.NAME``)."""
    problems: list[GraphProblem] = []
    conc = options.get("concurrency")
    if conc is not None and (not isinstance(conc, int) or isinstance(conc, bool) or conc < 1):
        problems.append(
            GraphProblem(
                f"{where}.options.concurrency",
                f"concurrency is {conc!r}",
                "use a positive integer: how many calls of this model may run at once (e.g. 2)",
            )
        )
    timeout = options.get("call_timeout_ms")
    if timeout is not None and (not _is_number(timeout) or not 0 < timeout < float("inf")):
        problems.append(
            GraphProblem(
                f"{where}.options.call_timeout_ms",
                f"call_timeout_ms is {timeout!r}",
                "use a positive number of milliseconds (e.g. 5000), or leave it out for no deadline",
            )
        )
    return problems
