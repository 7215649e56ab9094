"""Admission control: an in-flight gate, a budget for bodies being received, bounded body reads.

Everything here refuses work *before* it costs memory or holds a slot: the declared
``Content-Length`` is checked first, bodies are counted while they stream (chunked uploads
carry no length), a body must arrive within a deadline (a slow client cannot hold memory or
a slot forever), and a request takes an in-flight slot only once its whole body is here, so
stalled uploads never keep other clients out.

Request limits a graph may raise in its top-level ``limits:`` section (defaults here):

==========================  ===============  =================================================
key                         default          refused with 413 when
==========================  ===============  =================================================
``max_body_bytes``          32 MiB           the request body is larger (``--max-body-mb`` wins)
``max_nesting_depth``       32               JSON lists/objects nest deeper
``max_image_pixels``        40,000,000       a decoded image has more pixels (from its header)
``max_aspect_ratio``        50               an image's long side / short side is larger
``max_text_chars``          20,000           a text input has more characters
==========================  ===============  =================================================

``image_formats`` (default PNG, JPEG, WEBP, BMP, TIFF, GIF; EPS never) lists the decoders an
image input may use. OCR detection pre-processing refuses (413) an image whose det input would
exceed its node option ``max_pixels`` (8,000,000) before allocating it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request

from usg.errors import Overloaded, PayloadTooLarge
from usg.runtime.inputs import graph_limit
from usg.serve.errors import BodyTimeout

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_NESTING_DEPTH",
    "BodyBudget",
    "BodyTimeout",
    "InflightGate",
    "RequestLimits",
    "check_content_length",
    "read_body",
]

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
DEFAULT_MAX_NESTING_DEPTH = 32


@dataclass(frozen=True)
class RequestLimits:
    """The HTTP-level limits of one server: from the graph's ``limits:``, the CLI winning for the body."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_nesting_depth: int = DEFAULT_MAX_NESTING_DEPTH

    @classmethod
    def of(cls, graph_limits: Any, *, max_body_bytes: int | None = None) -> RequestLimits:
        body = max_body_bytes or int(graph_limit(graph_limits, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
        depth = int(graph_limit(graph_limits, "max_nesting_depth", DEFAULT_MAX_NESTING_DEPTH))
        return cls(max_body_bytes=body, max_nesting_depth=depth)


class InflightGate:
    """At most ``capacity`` requests inside at once; the rest are refused, never queued.

    Queueing at the HTTP layer would hide overload from clients and grow memory with
    the burst; a fast 429 with ``Retry-After`` lets them back off (the per-model
    batcher queues behind this gate are bounded too).
    """

    def __init__(self, capacity: int, *, retry_after: float = 1.0) -> None:
        if capacity < 1:
            raise ValueError(f"max in-flight must be >= 1, got {capacity}")
        self.capacity = capacity
        self.retry_after = retry_after
        self._inflight = 0

    @property
    def inflight(self) -> int:
        return self._inflight

    def check(self) -> None:
        """Raise :class:`Overloaded` (HTTP 429) if no slot is free, without taking one."""
        if self._inflight >= self.capacity:
            raise Overloaded(
                f"server is at capacity ({self._inflight} requests in flight, limit {self.capacity}); "
                f"retry after {self.retry_after:g} s, or raise --max-inflight",
                retry_after=self.retry_after,
                why="inflight",
            )

    def acquire(self) -> None:
        """Take a slot or raise :class:`Overloaded`. Runs on the event loop: no lock needed."""
        self.check()
        self._inflight += 1

    def release(self) -> None:
        self._inflight = max(0, self._inflight - 1)


class BodyBudget:
    """Bytes reserved by bodies being received (declared length, or the body limit when chunked)."""

    def __init__(self, capacity: int, *, retry_after: float = 1.0) -> None:
        self.capacity = capacity
        self.retry_after = retry_after
        self.reserved = 0
        self.receiving = 0

    def reserve(self, n: int) -> None:
        if self.reserved + n > self.capacity:
            raise Overloaded(
                f"server is receiving {self.receiving} bodies ({self.reserved} bytes reserved, "
                f"budget {self.capacity}); retry after {self.retry_after:g} s",
                retry_after=self.retry_after,
                why="receiving",
            )
        self.reserved += n
        self.receiving += 1

    def release(self, n: int) -> None:
        self.reserved = max(0, self.reserved - n)
        self.receiving = max(0, self.receiving - 1)


def _too_large(size: int | str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body is {size} bytes, above the limit of {limit} bytes ({limit / 2**20:g} MiB)",
        field="body",
        fix="send a smaller body (downscale or re-encode the image), or raise limits.max_body_bytes "
        "in the graph (or start the server with a larger --max-body-mb)",
    )


def declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        return int(declared)
    except ValueError:
        return None  # the server's HTTP parser rejects a malformed length itself


def check_content_length(request: Request, limit: int) -> None:
    """Refuse a declared body above ``limit`` before reading any of it."""
    size = declared_length(request)
    if size is not None and size > limit:
        raise _too_large(size, limit)


async def read_body(request: Request, limit: int, *, timeout_s: float | None = None) -> bytes:
    """Read the whole body within ``timeout_s``, refusing it once more than ``limit`` bytes arrived."""
    check_content_length(request, limit)
    chunks: list[bytes] = []
    total = 0
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise _too_large(f"more than {limit}", limit)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not arrive within {timeout_s:g} s ({total} bytes received in "
            f"{time.monotonic() - t0:.1f} s); fix: send the whole body promptly, or start the server "
            "with a larger --body-timeout",
        ) from None
    except ClientDisconnect:
        raise BodyTimeout("the client disconnected before sending its whole body") from None
    return b"".join(chunks)
