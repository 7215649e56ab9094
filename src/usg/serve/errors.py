"""USG errors as HTTP responses: one formatter per protocol, registered once as Starlette handlers.

``/v1`` bodies are ``exc.to_dict()`` (``error`` is the machine reason, ``message``, ``field``,
``fix``). Open Inference Protocol clients (tritonclient) read ``error`` as the message, so
``/v2`` bodies put the message there and the reason under ``code``. Both carry ``request_id``.
5xx bodies never carry internal details (library paths, stack frames): the server log has
them, under the same request id.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from usg.errors import FixableError, InputError, Overloaded, PayloadTooLarge, RequestTimeout, StateError, USGError
from usg.serve.decode import safe_text

__all__ = [
    "BodyTimeout",
    "ClientGone",
    "DrainingError",
    "Formatter",
    "InternalError",
    "ModelNotFound",
    "Unauthorized",
    "exception_handlers",
    "public_message",
    "rejection_reason",
    "v1_error",
    "v1_error_body",
    "v2_error",
]

log = logging.getLogger("usg.serve")

Formatter = Callable[[USGError, str | None], JSONResponse]


class DrainingError(StateError):
    """The server got SIGTERM: it finishes accepted requests and takes no new ones."""

    reason = "draining"


class ModelNotFound(USGError):
    """An Open Inference Protocol path names a model (graph) this server does not serve."""

    status = 404
    reason = "not_found"


class Unauthorized(USGError):
    """``--api-key-env`` is set and the request has no valid ``Authorization: Bearer`` key."""

    status = 401
    reason = "unauthorized"


class BodyTimeout(USGError):
    """The client did not send its whole body within the body timeout (a slow or stalled upload)."""

    status = 408
    reason = "body_timeout"


class ClientGone(USGError):
    """The client closed its connection before its answer: the request was cancelled (its engine
    requests closed, its slot freed). Nobody reads the answer; 499 is what the access log and the
    metrics count (nginx's "client closed request")."""

    status = 499
    reason = "client_closed"


class InternalError(USGError):
    """A bug (ours or a node's) surfaced while serving; the details stay in the server log."""

    status = 500
    reason = "internal"


class HTTPRouteError(FixableError):
    """Starlette's own refusals (unknown path, wrong method) as a USG error with a JSON body."""

    def __init__(self, status: int, message: str, fix: str | None = None) -> None:
        self.status = status
        self.reason = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        super().__init__(message, fix)


def _route_fix(status: int, path: str, allow: str | None) -> str | None:
    """What to do about Starlette's own 404 / 405 (they named no fix: "Method Not Allowed: /v1/infer")."""
    if status == 405 and allow:
        return f"send {path} as {' or '.join(m.strip() for m in allow.split(','))}"
    if status == 404:
        return (
            "use POST /v1/infer, /v2/models/{graph}/infer (and /generate), GET /metrics or /v2/health/ready; "
            "GET /openapi.json describes /v1"
        )
    return None


def rejection_reason(exc: USGError) -> str | None:
    """The ``reason`` label of the rejected-requests counter, or None for a non-rejection (e.g. a 500)."""
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, PayloadTooLarge):
        return "too_large"
    if isinstance(exc, InputError):
        return "bad_input"
    if isinstance(exc, RequestTimeout):
        return "timeout"
    if isinstance(exc, DrainingError):
        return "draining"
    if isinstance(exc, StateError):
        return "unavailable"
    if isinstance(exc, Unauthorized):
        return "unauthorized"
    if isinstance(exc, BodyTimeout):
        return "slow_client"
    return None


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.+@-]+){2,}(?::\d+)?")
# what a path-like match is not a file path in: a URL (``http://host:port/v1/...``) or an HTTP
# route after its method (``POST /v1/chat/completions``); the engine's own API routes (/v1/, /v2/)
_URL_BEFORE = re.compile(
    r"(?:\b(?:https?|wss?|grpcs?|rediss?|s3|gs)://?[^\s/]*|\b(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) )$"
)
_API_ROUTE = re.compile(r"/v[12]/[\w/{}-]*$")  # no dots: a file under a v1/ folder is still a path


def _redact_paths(line: str) -> str:
    """File paths in ``line`` → ``<path>``; URLs and API routes stay (they name the engine to fix)."""

    def one(m: re.Match[str]) -> str:
        if _URL_BEFORE.search(line, 0, m.start()) or _API_ROUTE.match(m.group(0)):
            return m.group(0)
        return "<path>"

    return _PATH.sub(one, line)


def _public_message(exc: USGError, request_id: str | None) -> str:
    """The message a client may see: 5xx messages lose file paths and are cut to one short line."""
    text = safe_text(str(exc))
    if exc.status < 500 or exc.status in (503, 504):
        return text
    line = _redact_paths(text.splitlines()[0] if text else exc.reason)
    if len(line) > 300:
        line = line[:300] + "…"
    return f"{line} (details in the server log, request id {request_id})"


def public_message(exc: USGError, request_id: str | None = None) -> str:
    """The message of ``exc`` a client may see (5xx: no file paths, one short line)."""
    return _public_message(exc, request_id)


def _finish(body: dict[str, Any], exc: USGError, request_id: str | None) -> JSONResponse:
    if request_id is not None:
        body["request_id"] = request_id
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded):
        body["retry_after"] = exc.retry_after
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, (DrainingError, BodyTimeout)):
        headers["Connection"] = "close"  # draining: go elsewhere; a cut-off body: the stream is out of step
    clean = {k: safe_text(v) if isinstance(v, str) else v for k, v in body.items()}
    return JSONResponse(clean, status_code=exc.status, headers=headers)


def v1_error_body(exc: USGError, request_id: str | None = None) -> dict[str, Any]:
    """The ``/v1`` error object (also the ``error`` event of a stream): ``{"error": reason,
    "message", "field", "fix", "node", "request_id"}`` (``node``: the graph node that failed)."""
    body = dict(exc.to_dict())
    if exc.status >= 500:
        body["message"] = _public_message(exc, request_id)
        body.pop("problems", None)
    if exc.node is not None:
        body["node"] = exc.node
    if request_id is not None:
        body["request_id"] = request_id
    return {k: safe_text(v) if isinstance(v, str) else v for k, v in body.items()}


def v1_error(exc: USGError, request_id: str | None = None) -> JSONResponse:
    """``/v1`` and server-wide error body: :func:`v1_error_body`."""
    return _finish(v1_error_body(exc, request_id), exc, request_id)


def v2_error(exc: USGError, request_id: str | None = None) -> JSONResponse:
    """Open Inference Protocol error body: ``{"error": message, "code": reason, "field", "fix", ...}``."""
    body = dict(exc.to_dict())
    body.pop("problems", None)
    body["code"] = body.get("error")
    body["error"] = _public_message(exc, request_id)
    body.pop("message", None)
    if exc.node is not None:
        body["node"] = exc.node
    return _finish(body, exc, request_id)


def exception_handlers(
    fmt: Formatter, on_error: Callable[[Request, USGError, Response], None] | None = None
) -> Mapping[Any, Callable[..., Any]]:
    """Starlette ``exception_handlers`` rendering :class:`USGError` (and Starlette's own
    :class:`HTTPException`) with ``fmt``; ``on_error`` sees every error response (metrics)."""

    async def usg_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, USGError)
        rid = getattr(request.state, "request_id", None)
        if exc.status >= 500 and exc.status not in (503, 504):
            log.error("request %s failed: %s", rid, exc)
        response = fmt(exc, rid)
        if rid is not None:
            response.headers["X-Request-Id"] = rid
        if on_error is not None:
            on_error(request, exc, response)
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        fix = _route_fix(exc.status_code, path, (exc.headers or {}).get("Allow"))
        return await usg_error(request, HTTPRouteError(exc.status_code, f"{exc.detail}: {path}", fix))

    return {USGError: usg_error, HTTPException: http_error}
