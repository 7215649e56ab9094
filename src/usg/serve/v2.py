"""Open Inference Protocol v2 (KServe v2 / Triton HTTP), with the binary tensor data extension.

The graph is served as one model named after the graph, version ``"1"``.

Inputs: a text input is ``BYTES`` ``[1]`` (UTF-8); an image input is ``BYTES`` ``[1]`` holding the
encoded file (PNG/JPEG/...) as binary data, or base64 of it in JSON ``data`` (JSON strings cannot
carry raw bytes), or ``UINT8`` ``[H, W, 3]`` raw pixels; a tensor input has the
datatype of its spec (``FP32`` ...). Outputs: numeric arrays keep their datatype and shape;
strings are ``BYTES``; a list of records (such as OCR ``lines``) is ``BYTES`` ``[n]`` with one
JSON document per element (``json.loads(x)`` gives ``{"text", "score", "box"}``); any other
value is ``BYTES`` ``[1]`` holding one JSON document. Outputs a request pruned are left out.
The response's ``parameters`` carry ``pruned_nodes`` (comma-separated) and ``request_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg import __version__
from usg.errors import InputError
from usg.graph import Graph, describe_model
from usg.graph.model import model_output
from usg.runtime.result import to_jsonable
from usg.serve.binary import V2Tensor, decode_tensor, dtype_to_datatype, encode_response, split_body
from usg.serve.errors import ModelNotFound, error_response
from usg.serve.limits import read_body
from usg.serve.v1 import b64_image
from usg.specs import Modality, TensorSpec

if TYPE_CHECKING:
    from usg.serve.app import ServeContext

__all__ = ["graph_metadata", "routes", "to_v2_output"]

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


def to_v2_output(value: Any) -> tuple[str, list[int], np.ndarray[Any, Any] | list[bytes]]:
    """An output value → (datatype, shape, array or BYTES elements); see the module docstring."""
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
            x.encode("utf-8") if isinstance(x, str) else json.dumps(to_jsonable(x), ensure_ascii=False).encode("utf-8")
            for x in value
        ]
        return "BYTES", [len(elems)], elems
    return "BYTES", [1], [json.dumps(to_jsonable(value), ensure_ascii=False).encode("utf-8")]


def _graph_value(graph: Graph, t: V2Tensor) -> Any:
    d = graph.inputs.get(t.name)
    if d is None:
        raise InputError(
            f"unknown input {t.name!r} for model {graph.name!r}",
            field=t.name,
            fix=f"use the model's inputs: {', '.join(sorted(graph.inputs))}",
        )
    if d.modality in (Modality.TEXT, Modality.IMAGE) and t.datatype == "BYTES":
        assert isinstance(t.value, list)
        if len(t.value) != 1:
            raise InputError(
                f"{t.name}: expected 1 BYTES element, got shape {list(t.shape)}",
                field=t.name,
                fix=f"send {t.name} with shape [1]",
            )
        if d.modality is Modality.IMAGE and not t.binary:  # JSON strings cannot hold raw image bytes
            return b64_image(t.name, t.value[0].decode("utf-8"))
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
        expected = {Modality.TEXT: "BYTES", Modality.IMAGE: "BYTES (encoded image) or UINT8 [H,W,3]"}.get(
            d.modality, "a numeric datatype"
        )
    raise InputError(
        f"{t.name}: datatype {t.datatype} does not match the input ({d.modality.value}, expects {expected})",
        field=t.name,
        fix=f"send {t.name} as {expected}",
    )


def parse_v2_request(graph: Graph, body: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode a v2 inference request → (executor inputs, JSON header)."""
    header, tail = split_body(body, header_length)
    entries = header.get("inputs")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(
            'the request has no "inputs" list of tensors',
            field="inputs",
            fix='send {"inputs": [{"name", "shape", "datatype", "data"}]}',
        )
    raw: dict[str, Any] = {}
    offset = 0
    for entry in entries:
        tensor, offset = decode_tensor(entry, tail, offset)
        if tensor.name in raw:
            raise InputError(
                f"input {tensor.name!r} is given more than once",
                field=tensor.name,
                fix="send each input once",
            )
        raw[tensor.name] = _graph_value(graph, tensor)
    if offset != len(tail):
        raise InputError(
            f"{len(tail) - offset} bytes of binary data follow the tensors' binary_data_size total ({offset})",
            field="body",
            fix="make each binary_data_size match its tensor's data",
        )
    return raw, header


def _wants(header: Mapping[str, Any], graph: Graph) -> list[tuple[str, bool]]:
    params = header.get("parameters") or {}
    default_binary = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    requested = header.get("outputs")
    if not requested:
        return [(name, default_binary) for name in graph.outputs]
    out: list[tuple[str, bool]] = []
    for r in requested:
        name = r.get("name") if isinstance(r, dict) else None
        if name not in graph.outputs:
            raise InputError(
                f"requested output {name!r} does not exist",
                field="outputs",
                fix=f"request some of: {', '.join(graph.outputs)}",
            )
        p = r.get("parameters") or {}
        out.append((str(name), bool(p.get("binary_data", default_binary))))
    return out


def routes(ctx: ServeContext) -> list[Route]:
    graph = ctx.graph
    metadata: list[dict[str, Any]] = []  # computed once, on first use (reads model files' headers)

    def check_model(request: Request) -> None:
        name = request.path_params["model"]
        version = request.path_params.get("version", VERSION)
        if name != graph.name or version not in (VERSION, ""):
            raise ModelNotFound(
                f"model {name!r} version {version!r} is not served here; "
                f"fix: use model {graph.name!r} (version {VERSION})"
            )

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": ctx.ready, "state": ctx.state.value}, status_code=200 if ctx.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": "usg", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def model_metadata(request: Request) -> Response:
        try:
            check_model(request)
        except ModelNotFound as exc:
            return error_response(exc, v2=True)
        if not metadata:
            metadata.append(graph_metadata(graph))
        return JSONResponse(metadata[0])

    async def model_ready(request: Request) -> Response:
        try:
            check_model(request)
        except ModelNotFound as exc:
            return error_response(exc, v2=True)
        return JSONResponse({"name": graph.name, "ready": ctx.ready}, status_code=200 if ctx.ready else 503)

    async def infer(request: Request) -> Response:
        async def work(rid: str) -> Response:
            check_model(request)
            body = await read_body(request, ctx.config.max_body_bytes)
            raw, header = parse_v2_request(graph, body, request.headers.get("inference-header-content-length"))
            wants = _wants(header, graph)
            params = [(t.get("name"), t.get("parameters")) for t in header.get("inputs") or [] if isinstance(t, dict)]
            expected = {str(n): p["sha256"] for n, p in params if isinstance(p, dict) and "sha256" in p}
            result = await ctx.infer(raw, rid, expected or None)
            tensors = []
            for name, binary in wants:
                if name not in result.outputs:
                    continue
                datatype, shape, value = to_v2_output(result.outputs[name])
                tensors.append(({"name": name, "datatype": datatype, "shape": shape}, value, binary))
            head = {
                "model_name": graph.name,
                "model_version": VERSION,
                "id": str(header.get("id", rid)),
                "parameters": {
                    "pruned_nodes": ",".join(result.pruned_nodes),
                    "request_id": rid,
                    # OIP parameter values are scalars: "image=sha256:<hex>,text=sha256:<hex>"
                    "integrity": ",".join(f"{k}={v}" for k, v in sorted(result.integrity.items())),
                },
            }
            content, header_len = encode_response(head, tensors)
            if header_len is None:
                return Response(content, media_type="application/json")
            return Response(
                content,
                media_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": str(header_len)},
            )

        return await ctx.guarded(request, "v2_infer", work, v2=True)

    return [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/models/{model}", model_metadata, methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}", model_metadata, methods=["GET"]),
        Route("/v2/models/{model}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
    ]
