"""Run-time contracts at model inputs: which specs apply, and a cheap check (dtype, rank, fixed and
symbolic dims; range if declared)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from usg.errors import ContractError
from usg.ops.wire import is_placeholder
from usg.specs import TensorSpec, merge_declared

__all__ = ["InputCheck", "check_model_inputs", "model_input_specs"]


def model_input_specs(
    file_specs: Mapping[str, TensorSpec], declared: Mapping[str, TensorSpec]
) -> dict[str, TensorSpec]:
    """The contract checked at a model's inputs: the backend's specs tightened by the graph's."""
    return merge_declared(file_specs, declared)


def _fix(spec: TensorSpec, arr: np.ndarray) -> str:
    got_dtype = arr.dtype.name
    if spec.rank == 4 and arr.ndim == 3 and got_dtype == "uint8":
        return (
            f"the model wants {spec.dtype} {spec.layout or 'NCHW'} with a batch axis; insert a preprocessing "
            f"node that scales, transposes HWC→CHW and adds the batch axis (e.g. fn: usg.ops.image:to_nchw_float)"
        )
    if spec.rank is not None and arr.ndim == spec.rank - 1:
        return "add the batch axis (x[None]) in the node that produces this tensor"
    if spec.dtype and got_dtype != spec.dtype:
        return f"cast to {spec.dtype} (x.astype(np.{spec.dtype})) in the node that produces this tensor"
    if spec.range is not None:
        return f"scale values into [{spec.range[0]:g}, {spec.range[1]:g}] before the model"
    return f"make the producing node emit {spec.describe()}"


def check_model_inputs(node: str, model: str, specs: Mapping[str, TensorSpec], item: Mapping[str, Any]) -> None:
    """Raise :class:`ContractError` naming the node, port, both specs and the fix if ``item`` breaks ``specs``."""
    bound: dict[str, tuple[int, str]] = {}
    for port, value in item.items():
        spec = specs.get(port)
        if spec is None:
            continue
        if spec.dtype == "str":
            continue
        if not isinstance(value, np.ndarray):
            raise ContractError(
                f"node {node!r} (model {model!r}) input {port!r}: got {type(value).__name__}, "
                f"expected an array {spec.describe()}",
                field=f"{node}.{port}",
                fix="make the producing node return a numpy array",
            )
        # a placeholder's values are computed on the remote side (usg.runtime.deferral): its range is not here
        problems = spec.check(value, check_range=spec.range is None or not is_placeholder(value))
        if problems:
            raise ContractError(
                f"node {node!r} (model {model!r}) input {port!r}: got {value.dtype.name}{list(value.shape)}, "
                f"model expects {spec.describe()}: {'; '.join(problems)}",
                field=f"{node}.{port}",
                fix=_fix(spec, value),
            )
        if spec.shape is not None:
            for axis, dim in enumerate(spec.shape):
                if isinstance(dim, str):
                    size = int(value.shape[axis])
                    if dim in bound and bound[dim][0] != size:
                        other_size, other_port = bound[dim]
                        raise ContractError(
                            f"node {node!r} (model {model!r}): input {port!r} axis {axis} ({dim}) is {size} but "
                            f"input {other_port!r} has {dim}={other_size}",
                            field=f"{node}.{port}",
                            fix=f"inputs sharing the dim {dim!r} must agree; pad or truncate them together",
                        )
                    bound.setdefault(dim, (size, port))


class InputCheck:
    """:func:`check_model_inputs` for one node, skipped for inputs of a dtype and shape it passed
    before (a stream's windows: the same shapes chunk after chunk). Only where no spec has a
    ``range`` (which depends on the values); remembers a bounded number of signatures."""

    _MAX_SEEN = 64

    def __init__(self, node: str, model: str, specs: Mapping[str, TensorSpec]) -> None:
        self.node, self.model, self.specs = node, model, specs
        self.by_shape = all(spec.range is None for spec in specs.values())
        self._seen: set[tuple[Any, ...]] = set()

    def __call__(self, item: Mapping[str, Any]) -> None:
        if not self.specs:  # nothing to check (e.g. an LLM node's messages: the backend checks them)
            return
        if not self.by_shape:
            check_model_inputs(self.node, self.model, self.specs, item)
            return
        key = tuple((p, v.dtype, v.shape) if isinstance(v, np.ndarray) else (p, type(v)) for p, v in item.items())
        if key in self._seen:
            return
        check_model_inputs(self.node, self.model, self.specs, item)
        if len(self._seen) >= self._MAX_SEEN:
            self._seen.clear()
        self._seen.add(key)
