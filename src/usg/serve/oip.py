"""The Open Inference Protocol v2 model of a graph, shared by the HTTP (``v2``) and gRPC front ends.

The graph is served as one model named after the graph, version ``"1"``. These functions hold
no transport: the metadata of the model, how a decoded request tensor becomes an executor
input, and how an output value becomes a v2 tensor (see :mod:`usg.serve.v2` for the wire rules).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.graph import Graph, describe_model
from usg.graph.model import model_output
from usg.runtime.result import to_jsonable
from usg.serve.binary import V2Tensor, dtype_to_datatype
from usg.serve.decode import b64_audio, b64_image
from usg.serve.errors import ModelNotFound
from usg.specs import Modality, TensorSpec

__all__ = ["VERSION", "check_model", "graph_metadata", "graph_value", "to_v2_output"]

VERSION = "1"


def _dims(spec: TensorSpec | None) -> list[int]:
    if spec is None or spec.shape is None:
        return [-1]
    return [d if isinstance(d, int) else -1 for d in spec.shape]


def _output_spec(graph: Graph, source: str, port: str) -> TensorSpec | None:
    node = graph.nodes.get(source)
    if node is None or node.model is None:
        return None
    io = describe_model(graph.models[node.model])
    if io is None:
        return None
    return io[1].get(model_output(port, io[1]))


def graph_metadata(graph: Graph) -> dict[str, Any]:
    """The v2 model metadata of a graph (inputs with their wire datatype, outputs where known)."""
    inputs: list[dict[str, Any]] = []
    for name, d in graph.inputs.items():
        entry: dict[str, Any]
        if d.modality is Modality.TEXT:
            entry = {"name": name, "datatype": "BYTES", "shape": [1]}
        elif d.modality is Modality.IMAGE:
            entry = {
                "name": name,
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"content": "encoded image (PNG/JPEG/...); or UINT8 [H,W,3] pixels"},
            }
        elif d.modality is Modality.AUDIO:
            entry = {
                "name": name,
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"content": "encoded audio (WAV/FLAC/OGG/MP3/AAC/M4A/WebM)"},
            }
        else:
            entry = {
                "name": name,
                "datatype": dtype_to_datatype(d.spec.dtype if d.spec else None),
                "shape": _dims(d.spec),
            }
        entry.setdefault("parameters", {})["optional"] = d.optional
        inputs.append(entry)
    outputs: list[dict[str, Any]] = []
    for name, ref in graph.outputs.items():
        if ref.is_graph_input:
            src = graph.inputs[ref.port]
            spec = src.spec if src.modality is Modality.TENSOR else None
        else:
            spec = _output_spec(graph, ref.source, ref.port)
        if spec is not None and spec.dtype not in (None, "str"):
            outputs.append({"name": name, "datatype": dtype_to_datatype(spec.dtype), "shape": _dims(spec)})
        else:
            outputs.append({"name": name, "datatype": "BYTES", "shape": [-1]})
    return {
        "name": graph.name,
        "versions": [VERSION],
        "platform": "usg",
        "inputs": inputs,
        "outputs": outputs,
    }


def to_v2_output(value: Any, name: str | None = None) -> tuple[str, list[int], np.ndarray[Any, Any] | list[bytes]]:
    """An output value → (datatype, shape, array or BYTES elements); see the module docstring.
    ``name``: the output's, for the error of a value JSON cannot carry."""
    where = "output" if name is None else f"output {name!r}"
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)) and not isinstance(value, (str, bytes)):
        arr = np.asarray(value)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        datatype = dtype_to_datatype(arr.dtype)
        if datatype != "BYTES":
            return datatype, list(arr.shape), arr
        items = [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in arr.reshape(-1).tolist()]
        return "BYTES", list(arr.shape), items
    if isinstance(value, str):
        return "BYTES", [1], [value.encode("utf-8")]
    if isinstance(value, bytes):
        return "BYTES", [1], [value]
    if isinstance(value, (list, tuple)):
        elems = [
            x.encode("utf-8")
            if isinstance(x, str)
            else json.dumps(to_jsonable(x, f"{where}[{i}]"), ensure_ascii=False).encode("utf-8")
            for i, x in enumerate(value)
        ]
        return "BYTES", [len(elems)], elems
    return "BYTES", [1], [json.dumps(to_jsonable(value, where), ensure_ascii=False).encode("utf-8")]


def graph_value(graph: Graph, t: V2Tensor) -> Any:
    """A decoded request tensor → the executor's value for that graph input (bytes, str or array)."""
    d = graph.inputs.get(t.name)
    if d is None:
        raise InputError(
            f"unknown input {t.name!r} for model {graph.name!r}",
            field=t.name,
            fix=f"use the model's inputs: {', '.join(sorted(graph.inputs))}",
        )
    if d.modality in (Modality.TEXT, Modality.IMAGE, Modality.AUDIO) and t.datatype == "BYTES":
        assert isinstance(t.value, list)
        if len(t.value) != 1:
            raise InputError(
                f"{t.name}: expected 1 BYTES element, got shape {list(t.shape)}",
                field=t.name,
                fix=f"send {t.name} with shape [1]",
            )
        if d.modality is not Modality.TEXT and not t.binary:  # JSON strings cannot hold raw file bytes
            decode = b64_image if d.modality is Modality.IMAGE else b64_audio
            return decode(t.name, t.value[0].decode("utf-8", errors="replace"))
        return t.value[0]
    if d.modality is Modality.IMAGE and t.datatype == "UINT8" and isinstance(t.value, np.ndarray):
        arr = t.value[0] if t.value.ndim == 4 and t.value.shape[0] == 1 else t.value
        return np.ascontiguousarray(arr)
    if d.modality is Modality.TENSOR and isinstance(t.value, np.ndarray):
        want = dtype_to_datatype(d.spec.dtype) if d.spec is not None and d.spec.dtype else None
        if want is None or want == t.datatype:
            return t.value
        expected = want
    else:
        expected = {
            Modality.TEXT: "BYTES",
            Modality.IMAGE: "BYTES (encoded image) or UINT8 [H,W,3]",
            Modality.AUDIO: "BYTES (the encoded audio file)",
        }.get(d.modality, "a numeric datatype")
    raise InputError(
        f"{t.name}: datatype {t.datatype} does not match the input ({d.modality.value}, expects {expected})",
        field=t.name,
        fix=f"send {t.name} as {expected}",
    )


def check_model(graph: Graph, name: str, version: str) -> None:
    """Raise :class:`ModelNotFound` unless ``name``/``version`` is the served graph (``""``: any version)."""
    if name != graph.name or version not in (VERSION, ""):
        raise ModelNotFound(
            f"model {name!r} version {version!r} is not served here; fix: use model {graph.name!r} (version {VERSION})"
        )
