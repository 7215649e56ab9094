"""Triton Python-backend models that run USG code: each generated ``model.py`` imports one of these.

Settings are read from the model's config.pbtxt ``parameters``:

- :class:`UsgModel` — a USG model backend (``tokenizer``, or ``onnxruntime`` with
  ``--onnx-via python``) built by :func:`usg.runtime.runner.backend_for`:
  ``usg_backend``, ``usg_file`` (in the version folder), ``usg_options`` (JSON);
- :class:`FnNodeModel` — a Python node of an ensemble, imported with
  :func:`usg.backends.python_fn.import_callable`: ``usg_fn``, ``usg_options`` (JSON),
  ``usg_text_inputs`` (JSON list of ports that receive a ``str``);
- :class:`usg.export.triton.bls.GraphModel` — the BLS model that runs the whole graph.

Every model also reads ``usg_item_axis`` (JSON list of tensors declared ``dims: [1]`` over a
scalar per item, see :mod:`usg.export.triton.wire`). A request that fails gets an error
response naming the model; the other requests of the same call are unaffected.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import BackendError, InputError
from usg.export.triton.wire import from_wire, text_value, to_wire

__all__ = ["FnNodeModel", "TritonModelBase", "UsgModel", "pb_utils"]


def pb_utils() -> Any:
    """Triton's ``triton_python_backend_utils`` (only importable inside the Python backend)."""
    import triton_python_backend_utils

    return triton_python_backend_utils


def triton_error(exc: BaseException) -> Any:
    pb = pb_utils()
    code = getattr(pb.TritonError, "INVALID_ARG", None) if isinstance(exc, InputError) else None
    message = str(exc) if isinstance(exc, (InputError, BackendError)) else f"{type(exc).__name__}: {exc}"
    return pb.TritonError(message) if code is None else pb.TritonError(message, code)


class TritonModelBase(abc.ABC):
    """Config reading, request decoding and response encoding shared by the USG Python models;
    subclasses say what one request computes (:meth:`run`)."""

    def initialize(self, args: Mapping[str, str]) -> None:
        self.config = json.loads(args["model_config"])
        self.name = str(self.config.get("name") or args.get("model_name", ""))
        self.params = {k: v.get("string_value", "") for k, v in (self.config.get("parameters") or {}).items()}
        self.version_dir = Path(args["model_repository"]) / str(args["model_version"])
        self.input_names = [t["name"] for t in self.config.get("input", [])]
        self.output_types = {t["name"]: t["data_type"] for t in self.config.get("output", [])}
        self.item_axis = tuple(self.json_param("usg_item_axis", []))

    def json_param(self, key: str, default: Any) -> Any:
        raw = self.params.get(key)
        return default if not raw else json.loads(raw)

    def request_inputs(self, request: Any) -> dict[str, np.ndarray]:
        pb = pb_utils()
        out: dict[str, np.ndarray] = {}
        for name in self.input_names:
            tensor = pb.get_input_tensor_by_name(request, name)
            if tensor is not None:
                out[name] = tensor.as_numpy()
        return out

    def response(self, outputs: Mapping[str, Any]) -> Any:
        pb = pb_utils()
        tensors = [
            pb.Tensor(name, to_wire(outputs[name], dtype))
            for name, dtype in self.output_types.items()
            if outputs.get(name) is not None
        ]
        return pb.InferenceResponse(output_tensors=tensors)

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        """The outputs of one request's inputs."""

    def run_all(self, inputs: list[dict[str, np.ndarray]]) -> list[Mapping[str, Any] | BaseException]:
        results: list[Mapping[str, Any] | BaseException] = []
        for one in inputs:
            try:
                results.append(self.run(one))
            except Exception as exc:  # one failing request must not fail the others
                results.append(exc)
        return results

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = pb_utils()
        responses = []
        for result in self.run_all([self.request_inputs(r) for r in requests]):
            if not isinstance(result, BaseException):
                try:
                    responses.append(self.response(result))
                    continue
                except Exception as exc:  # an output that does not fit its declared dtype
                    result = exc
            responses.append(pb.InferenceResponse(output_tensors=[], error=triton_error(result)))
        return responses

    def finalize(self) -> None:
        return None


class UsgModel(TritonModelBase):
    """A USG backend (tokenizer, ONNX Runtime, ...) serving one Triton model.

    ONNX Runtime models get the requests of one call concatenated when their shapes agree
    (Triton's dynamic batcher hands them over together); other backends run per request.
    """

    def initialize(self, args: Mapping[str, str]) -> None:
        super().initialize(args)
        from usg.graph import ModelDef
        from usg.runtime.runner import backend_for

        path = self.version_dir / self.params["usg_file"] if self.params.get("usg_file") else None
        model = ModelDef(self.name, self.params["usg_backend"], path, self.json_param("usg_options", {}))
        self.backend = backend_for(model)
        self.backend.load()

    def run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        return self.backend.infer({k: from_wire(v) for k, v in inputs.items()})

    def run_all(self, inputs: list[dict[str, np.ndarray]]) -> list[Mapping[str, Any] | BaseException]:
        if self.backend.kind != "onnxruntime" or len(inputs) < 2:
            return super().run_all(inputs)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, one in enumerate(inputs):
            groups.setdefault(tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(one.items())), []).append(i)
        results: list[Mapping[str, Any] | BaseException] = [{} for _ in inputs]
        for members in groups.values():
            parts = [inputs[i] for i in members]
            try:
                merged = self.backend.infer({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
            except Exception:  # find the failing request(s) one by one
                for i, r in zip(members, super().run_all(parts), strict=True):
                    results[i] = r
                continue
            start = 0
            for i, p in zip(members, parts, strict=True):
                n = len(next(iter(p.values())))
                results[i] = {k: v[start : start + n] for k, v in merged.items()}
                start += n
        return results

    def finalize(self) -> None:
        self.backend.close()


class FnNodeModel(TritonModelBase):
    """A Python node (``fn: module:function``) as an ensemble step."""

    def initialize(self, args: Mapping[str, str]) -> None:
        super().initialize(args)
        from usg.backends.python_fn import accepted_params, import_callable

        self.fn_ref = self.params["usg_fn"]
        self.func = import_callable(self.fn_ref)
        names, var_kw = accepted_params(self.func)
        self.options = {k: v for k, v in self.json_param("usg_options", {}).items() if var_kw or k in names}
        self.text_inputs = set(self.json_param("usg_text_inputs", []))

    def run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        kwargs: dict[str, Any] = {k: text_value(v, k) if k in self.text_inputs else v for k, v in inputs.items()}
        out = self.func(**kwargs, **self.options)
        if not isinstance(out, dict):
            raise BackendError(f"fn {self.fn_ref} returned {type(out).__name__}; fix: return a dict of port -> value")
        skipped = [k for k in self.output_types if out.get(k) is None]
        if skipped:
            raise BackendError(
                f"fn {self.fn_ref} returned no value for {skipped}; an ensemble step cannot skip the steps "
                "after it; fix: return a value, or export the graph as a BLS model (make an input optional)"
            )
        return out
