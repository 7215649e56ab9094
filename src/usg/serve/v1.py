"""``POST /v1/infer``: multipart (image files, text fields) or JSON in; ``usg run --json`` out.

JSON requests: ``{"inputs": {"image": {"b64": "..."}, "text": "..."}}``; an image may also be a
bare base64 string (a ``data:`` URL prefix is accepted); a tensor input is a nested list or
``{"data": [...], "shape": [...]}`` (dtype from the graph); a ``timestamped`` input is a list of
``{"b64": "...", "ts_ms": N}`` (or ``{"image": ..., "ts_ms": N}``, the key named after the modality).
Multipart requests: images as file parts (or base64 text fields), text as fields (or UTF-8 file
parts), tensors as ``.npy`` files.
Images are never read from server paths. The response is exactly ``usg run --json``'s object
plus ``request_id``. ``"stream": true`` in the JSON body (or ``?stream=true``, e.g. with
multipart) answers with Server-Sent Events instead (:mod:`usg.serve.infer_stream`): one per node
that finished, the token deltas of LLM nodes, and last that same object.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from usg.errors import InputError
from usg.graph import Graph
from usg.npy import load_npy
from usg.runtime.inputs import ITEM_KEYS
from usg.serve.context import ServeContext
from usg.serve.decode import DEFAULT_FIX, b64_audio, b64_image, expected_digests, load_json, parsing
from usg.serve.infer_stream import event_stream, v1_renderer
from usg.serve.limits import DEFAULT_MAX_NESTING_DEPTH
from usg.specs import Modality

__all__ = ["convert_input", "parse_json_inputs", "routes"]

_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


def _tensor(graph: Graph, name: str, value: Any) -> np.ndarray[Any, Any]:
    spec = graph.inputs[name].spec
    dtype = spec.dtype if spec is not None and spec.dtype not in (None, "str") else None
    shape = None
    if isinstance(value, dict):
        shape = value.get("shape")
        value = value.get("data")
    try:
        arr = np.asarray(value, dtype=dtype)
        if shape is not None:
            arr = arr.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"{name}: cannot make a {dtype or 'numeric'} tensor of the value ({exc})",
            field=name,
            fix='send a nested list of numbers, or {"data": [...], "shape": [...]}',
        ) from None
    return arr


def _stamped(graph: Graph, name: str, value: Any) -> Any:
    """A timestamped input's JSON list ``[{"b64"|KEY: ..., "ts_ms": N}, ...]``: each item's value converted."""
    if not isinstance(value, list):
        return value  # normalize_inputs says what is expected
    key = ITEM_KEYS[graph.inputs[name].modality]
    out: list[Any] = []
    for item in value:
        if isinstance(item, dict) and any(k in item for k in (key, "value", "b64")):
            raw = item.get(key, item.get("value", {"b64": item.get("b64")}))
            item = {key: convert_input(graph, name, raw, item=True), "ts_ms": item.get("ts_ms")}
        out.append(item)
    return out


def convert_input(graph: Graph, name: str, value: Any, *, item: bool = False) -> Any:
    """A JSON/form value of input ``name`` → what the executor takes (bytes for images and audio, never a path)."""
    d = graph.inputs.get(name)
    if d is None or value is None:
        return value  # unknown names: normalize_inputs names them and lists the valid ones
    if d.timestamped and not item:
        return _stamped(graph, name, value)
    if d.modality is Modality.IMAGE:
        if isinstance(value, dict) and isinstance(value.get("b64"), str):
            return b64_image(name, value["b64"])
        if isinstance(value, str):
            return b64_image(name, value)
        if isinstance(value, bytes):
            return value
        raise InputError(
            f'{name}: an image must be base64 text or {{"b64": "..."}}, got {type(value).__name__}',
            field=name,
            fix='send {"b64": "<base64 of the PNG/JPEG file>"}, or upload it as a multipart file',
        )
    if d.modality is Modality.AUDIO:
        if isinstance(value, dict) and isinstance(value.get("b64"), str):
            value = value["b64"]
        if isinstance(value, str):
            return b64_audio(name, value)
        if isinstance(value, bytes):
            return value
        raise InputError(
            f'{name}: audio must be base64 text or {{"b64": "..."}}, got {type(value).__name__}',
            field=name,
            fix='send {"b64": "<base64 of the WAV/FLAC/OGG/MP3/M4A file>"}, or upload it as a multipart file',
        )
    if d.modality is Modality.TEXT:
        if isinstance(value, (str, bytes)):
            return value
        raise InputError(
            f"{name}: text must be a string, got {type(value).__name__}", field=name, fix="send a JSON string"
        )
    if isinstance(value, bytes):  # a .npy upload
        try:
            return load_npy(value)
        except (OSError, ValueError) as exc:
            raise InputError(
                f"{name}: uploaded file is not a .npy array ({exc})",
                field=name,
                fix="save the tensor with numpy.save and upload that file",
            ) from None
    return _tensor(graph, name, value)


def parse_json_inputs(
    graph: Graph,
    body: bytes,
    *,
    max_depth: int = DEFAULT_MAX_NESTING_DEPTH,
    expected: dict[str, str] | None = None,
    flags: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``{"inputs": {...}}`` → executor inputs; ``{"b64": ..., "sha256": ...}`` digests go to ``expected``;
    the top-level ``stream`` flag (if sent) goes to ``flags``."""
    doc = load_json(body, max_depth=max_depth, fix=DEFAULT_FIX)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        got = type(doc.get("inputs")).__name__ if isinstance(doc, dict) else type(doc).__name__
        raise InputError(
            f'body must be an object with an "inputs" object (got {got})',
            field="inputs",
            fix=f'send {{"inputs": {{NAME: VALUE}}}} with NAME one of {", ".join(sorted(graph.inputs))}',
        )
    if expected is not None:
        expected.update(expected_digests(doc["inputs"]))
    if flags is not None and "stream" in doc:
        flags["stream"] = doc["stream"]
    return {k: convert_input(graph, k, v) for k, v in doc["inputs"].items()}


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _part_digest(name: str, headers: Mapping[str, str]) -> str | None:
    """The SHA-256 a multipart file part declares: ``X-Content-SHA256: <hex>`` or RFC 9530
    ``Content-Digest: sha-256=:<base64>:`` (as hex), or None."""
    if "x-content-sha256" in headers:
        return headers["x-content-sha256"].strip()
    for item in headers.get("content-digest", "").split(","):
        algo, _, value = item.strip().partition("=")
        if algo.strip().lower() == "sha-256":
            try:
                return base64.b64decode(value.strip().strip(":"), validate=True).hex()
            except (binascii.Error, ValueError):
                raise InputError(
                    f"{name}: Content-Digest {value!r} is not base64",
                    field=name,
                    fix="send Content-Digest: sha-256=:<base64 of the digest>: (RFC 9530), or X-Content-SHA256: <hex>",
                ) from None
    return None


def _check_multipart_closed(content_type: str, body: bytes) -> None:
    """A multipart body cut off before its closing delimiter (``--boundary--``) is refused: the
    parser would drop the unfinished part silently and the request would look like it had no inputs."""
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "multipart/form-data":
        return
    boundary = next(
        (v.strip().strip('"') for k, _, v in (p.partition("=") for p in params.split(";")) if k.strip() == "boundary"),
        "",
    )
    if boundary and b"--" + boundary.encode("latin-1", "replace") + b"--" not in body:
        raise InputError(
            f"multipart body ({len(body)} bytes) ends before its closing boundary '--{boundary}--': it was cut off",
            field="body",
            fix="send the whole body (let the HTTP client build the multipart body and its Content-Length)",
        )


async def parse_form_inputs(
    graph: Graph, request: Request, body: bytes, expected: dict[str, str] | None = None
) -> dict[str, Any]:
    """Multipart / urlencoded form → executor inputs; the body was already read within limits. A file
    part's declared digest (:func:`_part_digest`) goes to ``expected``."""
    _check_multipart_closed(request.headers.get("content-type", ""), body)
    replay = Request(request.scope, _replay(body))
    raw: dict[str, Any] = {}
    try:
        async with replay.form(max_files=64, max_fields=256, max_part_size=max(len(body), 1)) as form:
            for key, item in form.multi_items():
                if key in raw:
                    raise InputError(f"input {key!r} is given more than once", field=key, fix="send each input once")
                if isinstance(item, UploadFile):
                    digest = _part_digest(key, item.headers)
                    if digest is not None and expected is not None:
                        expected[key] = digest
                    raw[key] = await item.read()
                else:
                    raw[key] = item
    except HTTPException as exc:  # python-multipart could not parse the body
        raise InputError(
            f"malformed form body: {exc.detail}",
            field="body",
            fix="send multipart/form-data with a boundary (let the HTTP client build it)",
        ) from None
    return {k: convert_input(graph, k, v) for k, v in raw.items()}


async def parse_request(
    ctx: ServeContext,
    request: Request,
    body: bytes,
    expected: dict[str, str] | None = None,
    flags: dict[str, Any] | None = None,
) -> dict[str, Any]:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and media not in _FORMS:
        raise InputError(
            f"content type {media or '(none)'!r} is not supported",
            field="content-type",
            fix='send multipart/form-data (image files, text fields) or application/json {"inputs": {...}}',
        )
    with parsing("the /v1 request"):
        if media == "application/json":
            return parse_json_inputs(
                ctx.graph, body, max_depth=ctx.limits.max_nesting_depth, expected=expected, flags=flags
            )
        return await parse_form_inputs(ctx.graph, request, body, expected)


_QUERY_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _stream_query(values: list[str]) -> bool:
    """``?stream=``: one of 1/true/yes or 0/false/no (any case), once."""
    flag = _QUERY_FLAGS.get(values[0].strip().lower()) if len(values) == 1 else None
    if flag is None:
        given = "&".join(f"stream={v}" for v in values)
        raise InputError(
            f"?{given[:100]} is not one stream flag (true or false)",
            field="stream",
            fix="send ?stream=true for Server-Sent Events, or ?stream=false (or no stream) for one whole answer",
        )
    return flag


def routes(ctx: ServeContext, prefix: str = "") -> list[Route]:
    """The ``/v1`` routes, their paths under ``prefix`` (in an app with the v1 error formatter)."""

    async def work(request: Request, rid: str, body: bytes) -> Response:
        expected: dict[str, str] = {}
        flags: dict[str, Any] = {}
        if request.scope.get("query_string") and "stream" in request.query_params:
            flags["stream"] = _stream_query(request.query_params.getlist("stream"))
        raw = await parse_request(ctx, request, body, expected, flags)
        stream = flags.get("stream", False)
        if not isinstance(stream, bool):
            raise InputError(
                f"stream must be true or false, got {stream!r}",
                field="stream",
                fix='send "stream": true for Server-Sent Events, or leave it out',
            )
        if stream:
            return await event_stream(ctx, raw, rid, expected or None, v1_renderer(rid))
        result = await ctx.infer(raw, rid, expected or None)
        return JSONResponse({**result.to_json_dict(), "request_id": rid})

    return [Route(f"{prefix}/infer", ctx.endpoint("v1_infer", work), methods=["POST"])]
