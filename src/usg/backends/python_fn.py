"""Python callables: ``module:function`` for function nodes, and a batch-callable model backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from usg.backends.base import DeclaredSpecsBackend
from usg.callables import accepted_params, import_callable
from usg.specs import TensorSpec

__all__ = ["PythonBackend", "accepted_params", "import_callable"]  # the two functions live in usg.callables


class PythonBackend(DeclaredSpecsBackend):
    """A model implemented by a Python callable taking and returning dicts of batched arrays."""

    kind = "python"

    def __init__(
        self,
        func: Callable[[Mapping[str, Any]], dict[str, Any]],
        input_specs: Mapping[str, TensorSpec] | None = None,
        output_specs: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        super().__init__(input_specs, output_specs)
        self._func = func

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return self._func(inputs)
