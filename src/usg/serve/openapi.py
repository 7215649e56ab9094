"""``GET /openapi.json``: an OpenAPI 3.1 description of ``/v1/infer`` for the served graph.

Built from the graph's inputs and outputs, so clients (and fuzzers such as schemathesis or
hypothesis-jsonschema) see the exact input names: an image is base64 text or
``{"b64": ...}`` in JSON and a file part in multipart; a text is a string; a tensor is a
nested list or ``{"data", "shape"}``.
"""

from __future__ import annotations

from typing import Any

from usg import __version__
from usg.graph import Graph
from usg.specs import Modality

__all__ = ["document", "input_schema"]

_ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "machine-readable reason"},
        "message": {"type": "string"},
        "field": {"type": "string"},
        "fix": {"type": "string"},
        "request_id": {"type": "string"},
    },
}

NODE_MS_DESCRIPTION = (
    "Per node that ran, its wall time in milliseconds from the moment its inputs were ready to its "
    "outputs: the wait in its model's queue and batch window included, a map node's items together. "
    "Nodes on parallel branches overlap, so the times do not add up to the request's; nodes answered "
    "from the node cache are not listed."
)


def _value_schema(modality: Modality) -> dict[str, Any]:
    if modality is Modality.IMAGE:
        return {
            "oneOf": [
                {"type": "string", "description": "base64 of the encoded image (a data: URL prefix is accepted)"},
                {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string"}}},
            ]
        }
    if modality is Modality.AUDIO:
        return {
            "oneOf": [
                {"type": "string", "description": "base64 of a WAV/FLAC/OGG file (a data: URL prefix is accepted)"},
                {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string"}}},
            ]
        }
    if modality is Modality.TEXT:
        return {"type": "string"}
    return {
        "oneOf": [
            {"type": "array", "description": "nested lists of numbers"},
            {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"type": "array"}, "shape": {"type": "array", "items": {"type": "integer"}}},
            },
        ]
    }


def input_schema(graph: Graph) -> dict[str, Any]:
    """The JSON schema of a ``/v1/infer`` JSON body for ``graph``."""
    props = {name: _value_schema(d.modality) for name, d in graph.inputs.items()}
    required = [name for name, d in graph.inputs.items() if not d.optional]
    inputs: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        inputs["required"] = required
    return {"type": "object", "required": ["inputs"], "properties": {"inputs": inputs}}


def document(graph: Graph) -> dict[str, Any]:
    """The OpenAPI document of the server of ``graph``."""
    errors = {
        str(code): {"description": what, "content": {"application/json": {"schema": _ERROR}}}
        for code, what in (
            (400, "bad input (the field and the fix)"),
            (401, "API key missing or wrong (--api-key-env)"),
            (408, "the body did not arrive within the body timeout"),
            (413, "a limit was exceeded (the graph's limits: key that raises it)"),
            (422, "an input breaks a model's contract"),
            (429, "overloaded: retry after Retry-After seconds"),
            (503, "starting or draining"),
            (504, "past the request deadline"),
        )
    }
    form_props = {
        name: {"type": "string", "format": "binary"} if d.modality is not Modality.TEXT else {"type": "string"}
        for name, d in graph.inputs.items()
    }
    ok = {
        "type": "object",
        "required": ["outputs", "pruned_nodes", "node_ms", "request_id"],
        "properties": {
            "outputs": {"type": "object", "properties": {name: {} for name in graph.outputs}},
            "pruned_nodes": {"type": "array", "items": {"type": "string"}},
            "node_ms": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": NODE_MS_DESCRIPTION,
            },
            "request_id": {"type": "string"},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": f"usg serve: {graph.name}", "version": __version__},
        "paths": {
            "/v1/infer": {
                "post": {
                    "summary": f"Run graph {graph.name!r} on one request",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": input_schema(graph)},
                            "multipart/form-data": {"schema": {"type": "object", "properties": form_props}},
                        },
                    },
                    "responses": {
                        "200": {"description": "the outputs", "content": {"application/json": {"schema": ok}}},
                        **errors,
                    },
                }
            },
            "/v2/health/live": {"get": {"responses": {"200": {"description": "the process is up"}}}},
            "/v2/health/ready": {
                "get": {"responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}}}
            },
        },
    }
