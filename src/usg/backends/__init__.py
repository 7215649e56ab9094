"""Model backends: ONNX Runtime, Hugging Face tokenizers, Python callables, OpenAI-compatible engines.

A backend is created from what it needs — its kind, file, options and name —
by :func:`create_backend`; importing this package registers the kinds with graph
validation (:mod:`usg.graph.catalog`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from usg.backends.base import Backend, BackendState
from usg.backends.onnxruntime import OnnxRuntimeBackend, describe_onnx
from usg.backends.openai import LLM_INPUTS, LLM_OUTPUTS, OpenAIBackend
from usg.backends.python_fn import PythonBackend, import_callable
from usg.backends.tokenizer import TOKENIZER_INPUTS, TOKENIZER_OUTPUTS, TokenizerBackend
from usg.errors import GraphError, GraphProblem
from usg.graph.catalog import ModelIO, ModelKind, register_model_kind

__all__ = [
    "BACKEND_KINDS",
    "Backend",
    "BackendState",
    "OnnxRuntimeBackend",
    "OpenAIBackend",
    "PythonBackend",
    "TokenizerBackend",
    "create_backend",
]

Factory = Callable[[Path | None, Mapping[str, Any], str], Backend]


def _python(path: Path | None, options: Mapping[str, Any], name: str) -> Backend:
    ref = options.get("callable")
    if not ref:
        raise GraphError(
            [
                GraphProblem(
                    f"models.{name}",
                    "python backend without a callable",
                    "add options: {callable: 'package.module:function'}",
                )
            ]
        )
    return PythonBackend(import_callable(str(ref)))


def _need_path(path: Path | None, name: str) -> Path:
    if path is None:
        raise GraphError([GraphProblem(f"models.{name}", "no path", "add path: FILE")])
    return path


BACKEND_KINDS: dict[str, Factory] = {
    "onnxruntime": lambda path, options, name: OnnxRuntimeBackend(_need_path(path, name), options, name=name),
    "tokenizer": lambda path, options, name: TokenizerBackend(_need_path(path, name), options, name=name),
    "python": _python,
    "openai": lambda path, options, name: OpenAIBackend(options, name=name),
}


def _describe_onnx(path: Path | None) -> ModelIO | None:
    if path is None or not path.is_file():
        return None
    ins, outs, _ = describe_onnx(path)
    return ins, outs


def _describe_tokenizer(path: Path | None) -> ModelIO:
    return dict(TOKENIZER_INPUTS), dict(TOKENIZER_OUTPUTS)


register_model_kind(ModelKind("onnxruntime", needs_path=True, describe=_describe_onnx))
register_model_kind(ModelKind("tokenizer", needs_path=True, describe=_describe_tokenizer))
register_model_kind(ModelKind("python"))
register_model_kind(ModelKind("openai", describe=lambda path: (dict(LLM_INPUTS), dict(LLM_OUTPUTS))))


def create_backend(
    kind: str, path: Path | None = None, options: Mapping[str, Any] | None = None, *, name: str = ""
) -> Backend:
    """Instantiate (not load) a backend of ``kind`` for the model file ``path``."""
    factory = BACKEND_KINDS.get(kind)
    if factory is None:
        raise GraphError(
            [
                GraphProblem(
                    f"models.{name}.backend",
                    f"unknown backend {kind!r}",
                    f"use one of: {', '.join(sorted(BACKEND_KINDS))}",
                )
            ]
        )
    return factory(path, dict(options or {}), name)
