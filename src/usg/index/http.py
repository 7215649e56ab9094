"""``POST /v1/search`` on ``usg serve GRAPH --index INDEX``: top-k lines for a text, or pages for an image.

Request, JSON: ``{"query": "total due", "k": 10, "collections": ["invoices"]}``, or
``{"image": {"b64": "..."}, "k": 5}`` for pages that read like the image (its OCR text's
embedding against each indexed document's). Multipart: fields ``query`` / ``k`` and an
``image`` file. Response: ``{"query", "results": [{"collection", "document", "kind", "text",
"box", "score"}], "request_id"}`` (image queries add ``image_lines``, the text read from it).

The query is embedded by the served graph's own executor (its text branch only: OCR is pruned),
so it shares the encoder's batcher with ``/v1/infer`` traffic, and goes through the server's
admission (in-flight gate, body limit, draining). The index must have been built with the served
graph's encoder: :func:`search_routes` refuses another (at start-up, before serving).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from usg.errors import InputError
from usg.index.query import Searcher
from usg.index.store import MAX_K, DocumentIndex
from usg.runtime import InferResult

if TYPE_CHECKING:
    from usg.serve.context import ServeContext

__all__ = ["search_routes"]

_FIX = 'send {"query": "some text", "k": 10} (or {"image": {"b64": "..."}} for pages that look alike)'


def _k(value: Any) -> int:
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError  # 2.5 is not a count of results (int() would make it 2)
        k = int(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"k={value!r} is not an integer", field="k", fix=f"send k between 1 and {MAX_K}") from None
    if isinstance(value, bool) or not 1 <= k <= MAX_K:
        raise InputError(f"k={value!r} is out of range", field="k", fix=f"send k between 1 and {MAX_K}")
    return k


def _collections(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise InputError("collections must be a list of names", field="collections", fix='send ["name", ...]')
    return value or None


async def _parse(ctx: ServeContext, request: Request, body: bytes) -> dict[str, Any]:
    """The search request (JSON or a form), parsed within the server's limits; the body was read."""
    from usg.serve.decode import b64_image, load_json, parsing
    from usg.serve.v1 import parse_form_inputs

    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == "application/json":
        with parsing("the /v1/search request"):
            doc = load_json(body, max_depth=ctx.limits.max_nesting_depth, what="the /v1/search body", fix=_FIX)
        if not isinstance(doc, dict):
            raise InputError(f"body must be a JSON object, got {type(doc).__name__}", field="body", fix=_FIX)
        image = doc.get("image")
        if isinstance(image, dict) and isinstance(image.get("b64"), str):
            doc["image"] = b64_image("image", image["b64"])
        elif isinstance(image, str):
            doc["image"] = b64_image("image", image)
        elif image is not None:
            raise InputError('image must be base64 text or {"b64": "..."}', field="image", fix=_FIX)
        return doc
    if media in ("multipart/form-data", "application/x-www-form-urlencoded"):
        with parsing("the /v1/search form"):
            return await parse_form_inputs(ctx.graph, request, body)
    raise InputError(
        f"content type {media or '(none)'!r} is not supported", field="content-type", fix=f"{_FIX} as application/json"
    )


def search_routes(index_path: str | Path) -> Callable[[ServeContext], list[Route]]:
    """A route factory for ``create_app(..., extra_routes=[...])``: opens the index now (so a bad path or
    another encoder fails the server's start, not its first query) and serves ``POST /v1/search``."""
    index = DocumentIndex.open(index_path)

    def make(ctx: ServeContext) -> list[Route]:
        searcher = Searcher(index, ctx.graph)

        async def work(request: Request, rid: str, body: bytes) -> Response:
            doc = await _parse(ctx, request, body)
            unknown = sorted(set(doc) - {"query", "image", "k", "collections"})
            if unknown:
                raise InputError(f"unknown field(s) {unknown}", field=unknown[0], fix=_FIX)
            k = _k(doc.get("k", 10))
            collections = _collections(doc.get("collections"))

            async def infer(inputs: Mapping[str, Any]) -> InferResult:
                return await ctx.infer(inputs, rid)

            if doc.get("image") is not None:
                if doc.get("query") is not None:
                    raise InputError("send a query or an image, not both", field="query", fix=_FIX)
                hits, lines = await searcher.search_image(infer, doc["image"], k=k, collections=collections)
                reply = {"query": None, "image_lines": lines}
            else:
                if doc.get("query") is None:
                    raise InputError("no query given", field="query", fix=_FIX)
                hits = await searcher.search_text(infer, doc["query"], k=k, collections=collections)
                reply = {"query": doc["query"]}
            return JSONResponse({**reply, "results": [h.to_dict() for h in hits], "request_id": rid})

        return [Route("/v1/search", ctx.endpoint("v1_search", work), methods=["POST"])]

    return make
