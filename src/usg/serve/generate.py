"""Triton's generate extension: ``POST /v2/models/{graph}/generate`` and ``/generate_stream``.

Request (both URLs): ``{"text_input": "...", "parameters": {...}, NAME: VALUE, ...}``.
``text_input`` goes to the graph's input named ``text_input``, else to its only required text
input (else its only text input); other top-level fields are graph inputs by name, valued as in
``/v1`` JSON (an image as base64). ``parameters`` may carry ``stream`` (the URL decides); other
parameters are refused (generation settings live in the graph's model options).

Response: ``{"model_name", "model_version", "text_output", OUTPUT: VALUE, ...}``: ``text_output``
is the graph output named ``text_output``, else the first output fed by an LLM node
(``backend: openai``) that the request did not prune, else the first text output; the other
outputs follow by name (JSON). ``generate_stream`` sends Server-Sent ``data:`` events of that
shape: one per token delta of the node behind ``text_output`` (``text_output`` holds the delta),
then a last one with the rest of the text (empty when every token was streamed) and the other
outputs. An error after the stream started is ``data: {"error": "message"}``; one before is an
ordinary JSON error response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg.errors import InputError, USGError
from usg.graph import Graph
from usg.runtime.events import ExecutionEvent, Finished, TokenDelta
from usg.runtime.result import InferResult, to_jsonable
from usg.serve import oip
from usg.serve.context import ServeContext
from usg.serve.decode import DEFAULT_FIX, expected_digests, load_json, parsing
from usg.serve.errors import public_message
from usg.serve.infer_stream import Renderer, event_stream
from usg.serve.oip import VERSION
from usg.serve.sse import sse_data
from usg.serve.v1 import convert_input
from usg.specs import Modality

__all__ = ["parse_generate_request", "routes", "text_input_name", "text_output_names"]

_ALLOWED_PARAMETERS = frozenset({"stream"})


def text_input_name(graph: Graph) -> str:
    """The graph input ``text_input`` fills (see the module docstring)."""
    if "text_input" in graph.inputs:
        return "text_input"
    texts = [n for n, d in graph.inputs.items() if d.modality is Modality.TEXT]
    required = [n for n in texts if not graph.inputs[n].optional]
    for group in (required, texts):
        if len(group) == 1:
            return group[0]
    raise InputError(
        f"graph {graph.name!r} has {len(texts)} text inputs {texts}, so text_input names none of them",
        field="text_input",
        fix=f"send the inputs by name instead (top-level fields: {', '.join(sorted(graph.inputs))})",
    )


def text_output_names(graph: Graph) -> list[str]:
    """Graph outputs preferred as ``text_output``: the one named so, else those of LLM nodes."""
    if "text_output" in graph.outputs:
        return ["text_output"]
    llm: list[str] = []
    for name, ref in graph.outputs.items():
        node = None if ref.is_graph_input else graph.nodes.get(ref.source)
        if node is not None and node.model is not None and graph.models[node.model].backend == "openai":
            llm.append(name)
    return llm


def _pick(graph: Graph, outputs: Mapping[str, Any], chosen: str | None) -> str | None:
    """The output that is ``text_output``: ``chosen`` (streamed) if present, else the first
    preferred one present, else the first text value."""
    for name in (chosen, *text_output_names(graph)):
        if name is not None and name in outputs:
            return name
    return next((n for n, v in outputs.items() if isinstance(v, str)), None)


def parse_generate_request(graph: Graph, body: bytes, *, max_depth: int) -> tuple[dict[str, Any], dict[str, str]]:
    """A generate request → (executor inputs, digests the client declared)."""
    doc = load_json(body, max_depth=max_depth, fix=DEFAULT_FIX)
    if not isinstance(doc, dict):
        raise InputError(
            f"a generate request is a JSON object, got {type(doc).__name__}",
            field="body",
            fix='send {"text_input": "...", "parameters": {}}',
        )
    params = doc.pop("parameters", None) or {}
    if not isinstance(params, dict):
        raise InputError(
            f"parameters must be an object, got {type(params).__name__}",
            field="parameters",
            fix='send "parameters": {} or leave it out',
        )
    unknown = sorted(set(params) - _ALLOWED_PARAMETERS)
    if unknown:
        raise InputError(
            f"parameters {unknown} are not supported by graph {graph.name!r}",
            field="parameters",
            fix="set generation settings (max_tokens, temperature) in the graph's model options; "
            "send only stream here, or nothing",
        )
    if "text_input" in doc:
        name = text_input_name(graph)
        if name != "text_input" and name in doc:
            raise InputError(
                f"text_input and {name} both fill input {name!r}",
                field="text_input",
                fix="send one of them",
            )
        doc[name] = doc.pop("text_input")
    return {k: convert_input(graph, k, v) for k, v in doc.items()}, expected_digests(doc)


class _GenerateStream(Renderer):
    """``data:`` events of the generate response shape (see the module docstring)."""

    def __init__(self, graph: Graph, text_node: str | None, text_output: str | None, request_id: str) -> None:
        self.graph, self.text_node, self.text_output, self.rid = graph, text_node, text_output, request_id
        self.streamed: list[str] = []

    def event(self, event: ExecutionEvent) -> bytes | None:
        if isinstance(event, TokenDelta):
            if event.node != self.text_node:
                return None
            self.streamed.append(event.text)
            return sse_data(_head(self.graph, event.text))
        if isinstance(event, Finished):
            body = response_body(self.graph, event.result, self.text_output)
            sent = "".join(self.streamed)
            full = str(body["text_output"])
            body["text_output"] = full[len(sent) :] if sent and full.startswith(sent) else full
            return sse_data(body)
        return None  # node events are not part of the generate protocol

    def error(self, exc: USGError) -> bytes:
        return sse_data({"error": public_message(exc, self.rid)})


def _head(graph: Graph, text: str) -> dict[str, Any]:
    return {"model_name": graph.name, "model_version": VERSION, "text_output": text}


def response_body(graph: Graph, result: InferResult, text_output: str | None = None) -> dict[str, Any]:
    """The generate response object of a result (``text_output``: the output streamed, if any)."""
    outputs = {name: to_jsonable(v, f"output {name!r}") for name, v in result.outputs.items()}
    chosen = _pick(graph, outputs, text_output)
    text = outputs.pop(chosen, "") if chosen is not None else ""
    body = _head(graph, text if isinstance(text, str) else str(text))
    body.update(outputs)
    return body


def _streamed_output(graph: Graph, active: set[str]) -> tuple[str | None, str | None]:
    """(the text output whose tokens stream, the node behind it) for a request running ``active``."""
    for name in text_output_names(graph):
        ref = graph.outputs[name]
        if not ref.is_graph_input and ref.source in active:
            return name, ref.source
    return None, None


def routes(ctx: ServeContext) -> list[Route]:
    """The generate routes, relative to ``/v2`` (mounted with the v2 error formatter)."""
    graph = ctx.graph

    def prepare(request: Request, body: bytes) -> tuple[dict[str, Any], dict[str, str], str | None, str | None]:
        oip.check_model(graph, request.path_params["model"], request.path_params.get("version", VERSION))
        with parsing("the generate request"):
            raw, expected = parse_generate_request(graph, body, max_depth=ctx.limits.max_nesting_depth)
        active, _ = ctx.executor.plan({k for k, v in raw.items() if v is not None and k in graph.inputs})
        output, node = _streamed_output(graph, set(active))
        return raw, expected, output, node

    async def generate(request: Request, rid: str, body: bytes) -> Response:
        raw, expected, output, _node = prepare(request, body)
        result = await ctx.infer(raw, rid, expected or None)
        return JSONResponse(response_body(graph, result, output))

    async def generate_stream(request: Request, rid: str, body: bytes) -> Response:
        raw, expected, output, node = prepare(request, body)
        renderer = _GenerateStream(graph, node, output, rid)
        return await event_stream(ctx, raw, rid, expected or None, renderer)

    gen = ctx.endpoint("v2_generate", generate)
    stream = ctx.endpoint("v2_generate_stream", generate_stream)
    return [
        Route("/models/{model}/generate", gen, methods=["POST"]),
        Route("/models/{model}/versions/{version}/generate", gen, methods=["POST"]),
        Route("/models/{model}/generate_stream", stream, methods=["POST"]),
        Route("/models/{model}/versions/{version}/generate_stream", stream, methods=["POST"]),
    ]
