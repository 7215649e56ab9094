"""Checks of the model ``options:`` every backend kind shares (the runtime reads them).

``concurrency``: backend calls (batches) of the model in flight at once, a positive integer
(default 1). ``call_timeout_ms``: the deadline of one backend call, a positive number of
milliseconds (default: none). Other options belong to the backend kind and pass through;
the values of the ONNX Runtime backend's own options are checked here too
(:func:`onnxruntime_option_problems`), so a wrong one is a graph problem, not a crash at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usg.errors import GraphProblem

__all__ = ["model_option_problems", "onnxruntime_option_problems"]


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


#: ``optimization:`` values of the ONNX Runtime backend (its graph optimization levels)
ORT_OPTIMIZATION_LEVELS = ("all", "extended", "basic", "disable")


def onnxruntime_option_problems(where: str, options: Mapping[str, Any]) -> list[GraphProblem]:
    """Problems with the values of the ONNX Runtime backend's options (``intra_op_threads``,
    ``inter_op_threads``, ``optimization``, ``spin``, ``providers``) of the model at ``where``.
    Before, ``optimization: fast`` or ``intra_op_threads: two`` passed validation and failed as an
    internal error (KeyError, ValueError) when the model loaded."""
    problems: list[GraphProblem] = []
    for key in ("intra_op_threads", "inter_op_threads"):
        value = options.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            problems.append(
                GraphProblem(
                    f"{where}.options.{key}",
                    f"{key} is {value!r}",
                    "use a whole number of threads (e.g. 1; 0 or leaving it out: ONNX Runtime's default)",
                )
            )
    level = options.get("optimization")
    if level is not None and (not isinstance(level, str) or level not in ORT_OPTIMIZATION_LEVELS):
        problems.append(
            GraphProblem(
                f"{where}.options.optimization",
                f"optimization is {level!r}",
                f"use one of: {', '.join(ORT_OPTIMIZATION_LEVELS)} (default all)",
            )
        )
    spin = options.get("spin")
    if spin is not None and not isinstance(spin, bool):
        problems.append(GraphProblem(f"{where}.options.spin", f"spin is {spin!r}", "use true or false (default false)"))
    providers = options.get("providers")
    if providers is not None and (
        not isinstance(providers, list) or not all(isinstance(p, str) and p for p in providers)
    ):
        problems.append(
            GraphProblem(
                f"{where}.options.providers",
                f"providers is {providers!r}",
                "use a list of execution provider names, e.g. [CUDAExecutionProvider, CPUExecutionProvider]",
            )
        )
    return problems
