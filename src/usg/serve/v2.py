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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg import __version__
from usg.errors import InputError
from usg.graph import Graph
from usg.serve import oip
from usg.serve.binary import decode_tensor, encode_response, split_body
from usg.serve.errors import ModelNotFound, error_response
from usg.serve.limits import read_body
from usg.serve.oip import VERSION, graph_metadata, graph_value, to_v2_output

if TYPE_CHECKING:
    from usg.serve.app import ServeContext

__all__ = ["graph_metadata", "routes", "to_v2_output"]


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
        raw[tensor.name] = graph_value(graph, tensor)
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
        oip.check_model(graph, request.path_params["model"], request.path_params.get("version", VERSION))

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
            result = await ctx.infer(raw, rid)
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
                "parameters": {"pruned_nodes": ",".join(result.pruned_nodes), "request_id": rid},
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
