"""USG errors as HTTP responses: status from the error, a JSON body naming the field and the fix."""

from __future__ import annotations

import math

from starlette.responses import JSONResponse

from usg.errors import InputError, Overloaded, PayloadTooLarge, RequestTimeout, StateError, USGError

__all__ = ["DrainingError", "ModelNotFound", "error_response", "rejection_reason"]


class DrainingError(StateError):
    """The server got SIGTERM: it finishes accepted requests and takes no new ones."""

    reason = "draining"


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
    return None


def error_response(exc: USGError, *, v2: bool = False, request_id: str | None = None) -> JSONResponse:
    """The JSON error body of ``exc`` with its status.

    ``/v1`` bodies are ``exc.to_dict()`` (``error`` is the machine reason). Open Inference
    Protocol clients (tritonclient) read ``error`` as the message, so ``/v2`` bodies put the
    message there and the reason under ``code``.
    """
    body = exc.to_dict()
    if v2:
        body = {**body, "code": body.get("error"), "error": str(exc)}
        body.pop("message", None)
    if request_id is not None:
        body["request_id"] = request_id
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded):
        body["retry_after"] = exc.retry_after
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return JSONResponse(body, status_code=exc.status, headers=headers)


class ModelNotFound(USGError):
    """An Open Inference Protocol path names a model (graph) this server does not serve."""

    status = 404
    reason = "not_found"
