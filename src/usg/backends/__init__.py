"""Model backends: ONNX Runtime, Hugging Face tokenizers, Python callables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from usg.backends.base import Backend, BackendState
from usg.backends.onnxruntime import OnnxRuntimeBackend
from usg.backends.python_fn import PythonBackend, import_callable
from usg.backends.tokenizer import TokenizerBackend
from usg.errors import GraphError, GraphProblem
from usg.graph.model import ModelDef

__all__ = [
    "BACKEND_KINDS",
    "Backend",
    "BackendState",
    "OnnxRuntimeBackend",
    "PythonBackend",
    "TokenizerBackend",
    "create_backend",
]


def _python(model: ModelDef) -> Backend:
    ref = model.options.get("callable")
    if not ref:
        raise GraphError(
            [
                GraphProblem(
                    f"models.{model.name}",
                    "python backend without a callable",
                    "add options: {callable: 'package.module:function'}",
                )
            ]
        )
    return PythonBackend(import_callable(str(ref)))


BACKEND_KINDS: dict[str, Callable[[ModelDef], Backend]] = {
    "onnxruntime": lambda m: OnnxRuntimeBackend(_need_path(m), m.options, name=m.name),
    "tokenizer": lambda m: TokenizerBackend(_need_path(m), m.options, name=m.name),
    "python": _python,
}


def _need_path(model: ModelDef) -> Any:
    if model.path is None:
        raise GraphError([GraphProblem(f"models.{model.name}", "no path", "add path: FILE")])
    return model.path


def create_backend(model: ModelDef) -> Backend:
    """Instantiate (not load) the backend a model declares."""
    factory = BACKEND_KINDS.get(model.backend)
    if factory is None:
        raise GraphError(
            [
                GraphProblem(
                    f"models.{model.name}.backend",
                    f"unknown backend {model.backend!r}",
                    f"use one of: {', '.join(sorted(BACKEND_KINDS))}",
                )
            ]
        )
    return factory(model)
