"""Test doubles for code that uses USG: a :class:`FakeBackend` behind the backend seam."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from usg.backends.python_fn import PythonBackend
from usg.specs import TensorSpec

__all__ = ["FakeBackend"]


class FakeBackend(PythonBackend):
    """A backend whose batches are computed by ``handler(inputs) -> outputs``.

    Records every batch it receives in ``calls`` (a list of input dicts), so tests can
    assert how the executor and batcher grouped items.
    """

    kind = "fake"

    def __init__(
        self,
        handler: Callable[[Mapping[str, Any]], dict[str, Any]],
        input_specs: Mapping[str, TensorSpec] | None = None,
        output_specs: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        super().__init__(handler, input_specs, output_specs)
        self.handler = handler
        self.calls: list[dict[str, Any]] = []

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(dict(inputs))
        return self.handler(inputs)
