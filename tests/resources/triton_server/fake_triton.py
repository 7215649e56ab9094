"""A stand-in for Triton around the Python-backend models of an exported repository (unit tier).

It plays ``triton_python_backend_utils`` (tensors, requests, responses, errors) and the server:
:func:`load_repository` imports every ``model.py`` of a repository, calls ``initialize`` with the
``args`` Triton passes (the config as JSON), and BLS requests are routed to those models with
what Triton's core does on the way: a request shape must match the declared dims (with the
batch dim when ``max_batch_size > 0``), and an input declared with ``reshape`` reaches the
model reshaped. Only Python-backend models can be loaded (export with
``onnx_via="python"``). The e2e tier runs the same files in a real tritonserver.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format

MODELS: dict[str, tuple[Any, Any]] = {}  # name -> (TritonPythonModel instance, ModelConfig)


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    INVALID_ARG = 3

    def __init__(self, message: str, code: int | None = None) -> None:
        self._message, self.code = message, code

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor], error: TritonError | None = None) -> None:
        self.output_tensors, self._error = list(output_tensors), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class Request:
    """What ``execute`` receives."""

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.tensors = {t.name(): t for t in tensors}


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    return request.tensors.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors if t.name() == name), None)


def send(model: str, tensors: Sequence[Tensor]) -> InferenceResponse:
    instance, config = MODELS[model]
    shaped = []
    for t in tensors:
        decl = next(i for i in config.input if i.name == t.name())
        array = t.as_numpy()
        expected = ([-1] if config.max_batch_size > 0 else []) + list(decl.dims)
        if len(expected) != array.ndim or any(e not in (-1, a) for e, a in zip(expected, array.shape, strict=True)):
            message = f"unexpected shape for input {t.name()!r} for model {model!r}: expected {expected}, got"
            return InferenceResponse([], TritonError(f"{message} {list(array.shape)}", TritonError.INVALID_ARG))
        if decl.HasField("reshape"):
            lead = array.shape[:1] if config.max_batch_size > 0 else ()
            array = array.reshape(lead + tuple(decl.reshape.shape))
        shaped.append(Tensor(t.name(), array))
    return instance.execute([Request(shaped)])[0]  # type: ignore[no-any-return]


class InferenceRequest:
    def __init__(self, model_name: str, requested_output_names: Sequence[str], inputs: Sequence[Tensor]) -> None:
        self.model_name, self.inputs = model_name, list(inputs)

    def exec(self) -> InferenceResponse:
        return send(self.model_name, self.inputs)


def load_repository(repo: Path) -> None:
    """Import and initialize every model of ``repo`` (this module serves as triton_python_backend_utils)."""
    from tritonclient.grpc import model_config_pb2 as pb2

    sys.modules["triton_python_backend_utils"] = sys.modules[__name__]
    MODELS.clear()
    for path in sorted(repo.glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), pb2.ModelConfig())
        spec = importlib.util.spec_from_file_location(
            f"fake_triton_model_{config.name}", path.parent / "1" / "model.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        instance = module.TritonPythonModel()
        args = {
            "model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
            "model_repository": str(path.parent),
            "model_version": "1",
            "model_name": config.name,
        }
        instance.initialize(args)
        MODELS[config.name] = (instance, config)


def unload() -> None:
    for instance, _ in MODELS.values():
        instance.finalize()
    MODELS.clear()
    sys.modules.pop("triton_python_backend_utils", None)
