"""Open Inference Protocol v2 (KServe v2 / Triton HTTP), with the binary tensor data extension.

The graph is served as one model named after the graph, version ``"1"``.

Inputs: a text input is ``BYTES`` ``[1]`` (UTF-8); an image input is ``BYTES`` ``[1]`` holding the
encoded file (PNG/JPEG/...) as binary data, or base64 of it in JSON ``data`` (JSON strings cannot
carry raw bytes), or ``UINT8`` ``[H, W, 3]`` raw pixels; an audio input is ``BYTES`` ``[1]`` holding the
encoded file (WAV/FLAC/OGG/MP3/AAC/M4A/WebM), binary or base64 like an image; a tensor input has the
datatype of its spec (``FP32`` ...). Outputs: numeric arrays keep their datatype and shape;
strings are ``BYTES``; a list of records (such as OCR ``lines``) is ``BYTES`` ``[n]`` with one
JSON document per element (``json.loads(x)`` gives ``{"text", "score", "box"}``); any other
value is ``BYTES`` ``[1]`` holding one JSON document. Outputs a request pruned are left out.
The response's ``parameters`` carry ``pruned_nodes`` (comma-separated) and ``request_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg import __version__
from usg.errors import InputError
from usg.graph import Graph
from usg.serve import generate, oip
from usg.serve.binary import decode_tensor, encode_response, split_body
from usg.serve.context import ServeContext
from usg.serve.decode import expected_digests, parsing, safe_text
from usg.serve.limits import DEFAULT_MAX_NESTING_DEPTH
from usg.serve.oip import VERSION, graph_metadata, graph_value, to_v2_output

__all__ = ["graph_metadata", "routes", "server_metadata", "to_v2_output"]


def parse_v2_request(
    graph: Graph, body: bytes, header_length: str | None, *, max_depth: int = DEFAULT_MAX_NESTING_DEPTH
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode a v2 inference request → (executor inputs, JSON header)."""
    header, tail = split_body(body, header_length, max_depth=max_depth)
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
    params = header.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise InputError(
            f"parameters must be an object, got {type(params).__name__}",
            field="parameters",
            fix='send "parameters": {"binary_data_output": true} or leave it out',
        )
    default_binary = bool((params or {}).get("binary_data_output", False))
    requested = header.get("outputs")
    if requested is None or requested == []:
        return [(name, default_binary) for name in graph.outputs]
    if not isinstance(requested, list):
        raise InputError(
            f"outputs must be a list of {{name, parameters}} objects, got {type(requested).__name__}",
            field="outputs",
            fix=f'send "outputs": [{{"name": "{next(iter(graph.outputs))}"}}] or leave it out',
        )
    out: list[tuple[str, bool]] = []
    for r in requested:
        name = r.get("name") if isinstance(r, dict) else None
        if not isinstance(name, str) or name not in graph.outputs:
            raise InputError(
                f"requested output {name!r} does not exist",
                field="outputs",
                fix=f"request some of: {', '.join(graph.outputs)}",
            )
        p = r.get("parameters")
        if p is not None and not isinstance(p, dict):
            raise InputError(
                f"outputs[{name!r}].parameters must be an object, got {type(p).__name__}",
                field="outputs",
                fix='send "parameters": {"binary_data": true} or leave it out',
            )
        out.append((name, bool((p or {}).get("binary_data", default_binary))))
    return out


def server_metadata(ctx: ServeContext) -> Any:
    """``GET /v2``: the server's name, version and protocol extensions."""

    async def endpoint(request: Request) -> Response:
        ctx.authorize(request)
        return JSONResponse({"name": "usg", "version": __version__, "extensions": ["binary_tensor_data", "generate"]})

    return endpoint


def routes(ctx: ServeContext) -> list[Route]:
    """The v2 routes, relative to ``/v2`` (mounted there with the v2 error formatter)."""
    graph = ctx.graph
    metadata: list[dict[str, Any]] = []  # computed once, on first use (reads model files' headers)

    def check_model(request: Request) -> None:
        oip.check_model(graph, request.path_params["model"], request.path_params.get("version", VERSION))

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": ctx.ready, "state": ctx.state.value}, status_code=200 if ctx.ready else 503)

    async def model_metadata(request: Request) -> Response:
        ctx.authorize(request)
        check_model(request)
        if not metadata:
            metadata.append(graph_metadata(graph))
        return JSONResponse(metadata[0])

    async def model_ready(request: Request) -> Response:
        check_model(request)
        return JSONResponse({"name": graph.name, "ready": ctx.ready}, status_code=200 if ctx.ready else 503)

    async def work(request: Request, rid: str, body: bytes) -> Response:
        check_model(request)
        with parsing("the inference request"):
            header_length = request.headers.get("inference-header-content-length")
            raw, header = parse_v2_request(graph, body, header_length, max_depth=ctx.limits.max_nesting_depth)
            wants = _wants(header, graph)
        expected = expected_digests(
            {t.get("name"): t.get("parameters") for t in header.get("inputs") or [] if isinstance(t, dict)}
        )
        result = await ctx.infer(raw, rid, expected or None)
        tensors = []
        for name, binary in wants:
            if name not in result.outputs:
                continue
            datatype, shape, value = to_v2_output(result.outputs[name], name)
            tensors.append(({"name": name, "datatype": datatype, "shape": shape}, value, binary))
        head = {
            "model_name": graph.name,
            "model_version": VERSION,
            "id": safe_text(str(header.get("id", rid))),
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

    infer = ctx.endpoint("v2_infer", work)
    return [
        Route("/health/live", live, methods=["GET"]),
        Route("/health/ready", ready, methods=["GET"]),
        Route("/models/{model}", model_metadata, methods=["GET"]),
        Route("/models/{model}/versions/{version}", model_metadata, methods=["GET"]),
        Route("/models/{model}/ready", model_ready, methods=["GET"]),
        Route("/models/{model}/versions/{version}/ready", model_ready, methods=["GET"]),
        Route("/models/{model}/infer", infer, methods=["POST"]),
        Route("/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
        *generate.routes(ctx),  # Triton's generate extension (usg.serve.generate)
    ]
