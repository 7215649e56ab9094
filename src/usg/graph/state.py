"""A stateful model's ``state:`` section: which inputs are fed back from which outputs, on what axis.

``state: {pairs: {state: stateN}, batch_axis: 1, init: zeros}`` says the model takes its
recurrent state as input ``state`` and returns the next one as output ``stateN``; the batch
axis of both is 1 (silero-vad's state is ``[2, batch, 128]``). The executor keeps the state per
stream (a streaming session, or one request) and the batcher stacks the states of the items of
a batch on ``batch_axis`` and splits them back. Nodes do not wire the state inputs, and no wire
may name the state outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.errors import GraphProblem
from usg.graph.keys import unknown_key
from usg.specs import TensorSpec

__all__ = ["INITS", "StateSpec", "parse_state", "state_problems"]

_KEYS = {"pairs", "batch_axis", "init"}
#: how a new stream's state starts
INITS = ("zeros",)


@dataclass(frozen=True)
class StateSpec:
    """``pairs``: state input → the output that holds its next value; ``batch_axis`` of both."""

    pairs: dict[str, str] = field(default_factory=dict)
    batch_axis: int = 0
    init: str = "zeros"

    @property
    def outputs(self) -> set[str]:
        return set(self.pairs.values())

    def initial(self, spec: TensorSpec) -> np.ndarray:
        """A new stream's state for one item (batch axis of size 1) from the input's spec."""
        assert spec.shape is not None
        shape = [1 if axis == self.batch_axis else int(d) for axis, d in enumerate(spec.shape)]  # type: ignore[arg-type]
        return np.zeros(shape, dtype=spec.dtype or "float32")


def parse_state(where: str, data: Any) -> tuple[StateSpec | None, list[GraphProblem]]:
    """The ``state:`` mapping of a model (None when absent) and the schema problems found."""
    if data is None:
        return None, []
    fix = "write state: {pairs: {INPUT: OUTPUT}, batch_axis: N, init: zeros}"
    if not isinstance(data, dict):
        return None, [GraphProblem(where, f"state is {data!r}, not a mapping", fix)]
    problems = [unknown_key(where, k, _KEYS) for k in data if k not in _KEYS]
    pairs = data.get("pairs")
    if not isinstance(pairs, dict) or not pairs or not all(isinstance(v, str) for v in pairs.values()):
        problems.append(GraphProblem(f"{where}.pairs", f"pairs is {pairs!r}", fix))
        pairs = {}
    axis = data.get("batch_axis", 0)
    if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
        problems.append(GraphProblem(f"{where}.batch_axis", f"batch_axis is {axis!r}", "use an axis number >= 0"))
        axis = 0
    init = data.get("init", "zeros")
    if init not in INITS:
        problems.append(GraphProblem(f"{where}.init", f"init is {init!r}", f"use one of: {', '.join(INITS)}"))
        init = "zeros"
    return StateSpec({str(k): v for k, v in pairs.items()}, axis, str(init)), problems


def state_problems(
    where: str, state: StateSpec, inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec]
) -> list[GraphProblem]:
    """Check a state declaration against the model's inputs and outputs (from its file or backend)."""
    problems: list[GraphProblem] = []
    axis = state.batch_axis
    for src, dst in state.pairs.items():
        spec = inputs.get(src)
        if spec is None:
            problems.append(
                GraphProblem(
                    f"{where}.pairs.{src}",
                    f"the model has no input {src!r}",
                    f"name one of its inputs: {', '.join(sorted(inputs)) or '(none)'}",
                )
            )
            continue
        if dst not in outputs:
            problems.append(
                GraphProblem(
                    f"{where}.pairs.{src}",
                    f"the model has no output {dst!r}",
                    f"name the output holding the next state: one of {', '.join(sorted(outputs)) or '(none)'}",
                )
            )
        if spec.shape is None:
            problems.append(
                GraphProblem(
                    f"{where}.pairs.{src}",
                    f"input {src!r} has no known shape, so init {state.init} cannot be built",
                    "use a model file that declares the state's shape",
                )
            )
            continue
        if axis >= len(spec.shape):
            problems.append(
                GraphProblem(
                    f"{where}.batch_axis",
                    f"batch_axis {axis} is outside input {src!r} of rank {len(spec.shape)} {spec.describe()}",
                    f"use an axis below {len(spec.shape)} (silero-vad's state [2, batch, 128]: batch_axis: 1)",
                )
            )
            continue
        unknown = [a for a, d in enumerate(spec.shape) if a != axis and not isinstance(d, int)]
        if isinstance(spec.shape[axis], int) and spec.shape[axis] != 1:
            problems.append(
                GraphProblem(
                    f"{where}.batch_axis",
                    f"input {src!r} {spec.describe()} has a fixed size {spec.shape[axis]} on batch_axis {axis}"
                    + (f" and a dynamic one on axes {unknown}" if unknown else ""),
                    "set batch_axis to the axis that grows with the batch (silero-vad's [2, batch, 128]: 1)",
                )
            )
        elif unknown:
            problems.append(
                GraphProblem(
                    f"{where}.pairs.{src}",
                    f"input {src!r} {spec.describe()} has no fixed size on axes {unknown}, so init "
                    f"{state.init} cannot be built; the batch axis is {axis}",
                    "set batch_axis to the axis that grows with the batch, or use a model with fixed state dims",
                )
            )
    return problems
