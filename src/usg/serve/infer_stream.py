"""A request's execution events as a Server-Sent Events response (``/v1/infer`` with
``"stream": true``, and Triton's ``generate_stream``), each protocol rendering the events its way.

The first event is awaited before the response starts, so a request refused before any node
ran (bad input, a digest mismatch) gets its ordinary HTTP status and JSON error body; an error
after that is an error event, and the stream ends. Wire format of ``/v1``::

    event: node     data: {"node": "det", "ms": 12.5}            one per node that ran
    event: token    data: {"node": "answer", "text": "The"}      LLM token deltas, in order
    event: result   data: {<the non-streaming response object>}  last event on success
    event: error    data: {"status": 502, "error": ..., "message": ..., "node": ..., "request_id": ...}
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from usg.errors import USGError
from usg.runtime.events import ExecutionEvent, Finished, NodeFinished, TokenDelta
from usg.serve.context import ServeContext
from usg.serve.errors import InternalError, rejection_reason, v1_error_body
from usg.serve.sse import EventStreamResponse, json_str, sse_event

__all__ = ["Renderer", "event_stream", "v1_renderer"]

log = logging.getLogger("usg.serve")


class Renderer:
    """How one protocol writes events: ``event`` (None: not sent) and ``error``."""

    def event(self, event: ExecutionEvent) -> bytes | None:
        raise NotImplementedError

    def error(self, exc: USGError) -> bytes:
        raise NotImplementedError


class _V1(Renderer):
    def __init__(self, request_id: str) -> None:
        self.rid = request_id
        self._token_head: dict[str, str] = {}

    def event(self, event: ExecutionEvent) -> bytes | None:
        if isinstance(event, TokenDelta):  # once per token: the bytes sse_event writes, put together directly
            head = self._token_head.get(event.node)
            if head is None:
                head = self._token_head[event.node] = f'event: token\ndata: {{"node":{json_str(event.node)},"text":'
            return f"{head}{json_str(event.text)}}}\n\n".encode()
        if isinstance(event, NodeFinished):
            return sse_event("node", {"node": event.node, "ms": round(event.ms, 3)})
        return sse_event("result", {**event.result.to_json_dict(), "request_id": self.rid})

    def error(self, exc: USGError) -> bytes:
        return sse_event("error", {"status": exc.status, **v1_error_body(exc, self.rid)})


def v1_renderer(request_id: str) -> Renderer:
    return _V1(request_id)


async def event_stream(
    ctx: ServeContext,
    raw: Mapping[str, Any],
    request_id: str,
    expected: Mapping[str, str] | None,
    renderer: Renderer,
    *,
    headers: dict[str, str] | None = None,
) -> EventStreamResponse:
    """Start the request and answer with its events (see the module docstring)."""
    batches = ctx.stream(raw, request_id, expected)
    first = await anext(batches)  # an error here propagates: an ordinary HTTP error response
    return EventStreamResponse(_chunks(first, batches, renderer, lambda exc: _count(ctx, exc)), headers=headers)


def _render(renderer: Renderer, batch: list[ExecutionEvent]) -> tuple[list[bytes], Exception | None]:
    """The bytes of the batch's events, up to the first that failed to render (and its error)."""
    parts: list[bytes] = []
    for event in batch:
        try:
            chunk = renderer.event(event)
        except Exception as exc:
            return parts, exc
        if chunk is not None:
            parts.append(chunk)
    return parts, None


def _count(ctx: ServeContext, exc: USGError) -> None:
    if exc.status >= 500 and exc.status not in (503, 504):
        log.error("streamed request failed: %s", exc)
    reason = rejection_reason(exc)
    if reason is not None:
        ctx.metrics.reject(reason)


async def _chunks(
    first: list[ExecutionEvent],
    batches: AsyncGenerator[list[ExecutionEvent], None],
    renderer: Renderer,
    on_error: Callable[[USGError], None],
) -> AsyncGenerator[bytes, None]:
    """The events as SSE bytes: the events that arrived together (a batch) as one piece, in
    order, so deltas that piled up while the client or the loop was busy cost one send and one
    write; a batch of one event (a lone token) is sent as soon as it came."""
    failure: USGError | None = None
    try:
        batch = first
        while True:
            if len(batch) == 1:  # the usual batch while tokens trickle in
                chunk = renderer.event(batch[0])
                if chunk is not None:
                    yield chunk
            else:
                parts, error = _render(renderer, batch)
                if parts:
                    yield b"".join(parts)
                if error is not None:  # after what was rendered before it
                    raise error
            if isinstance(batch[-1], Finished):
                return
            batch = await anext(batches)
    except USGError as exc:
        failure = exc
    except Exception as exc:  # a bug: logged with its traceback, sent without internals
        log.exception("streamed request failed")
        failure = InternalError(f"internal error ({type(exc).__name__})")
    finally:
        await batches.aclose()  # cancels the request if the client went away
    assert failure is not None
    on_error(failure)
    yield renderer.error(failure)
