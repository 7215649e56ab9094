"""Admission control: a bounded in-flight gate and a request-body limit.

Both refuse work *before* it costs memory: the gate answers 429 without reading
the body, and the body limit checks ``Content-Length`` first, then counts bytes
while streaming (chunked uploads carry no length).
"""

from __future__ import annotations

from starlette.requests import Request

from usg.errors import Overloaded, PayloadTooLarge

__all__ = ["InflightGate", "check_content_length", "read_body"]


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

    def acquire(self) -> None:
        """Take a slot or raise :class:`Overloaded` (HTTP 429). Runs on the event loop: no lock needed."""
        if self._inflight >= self.capacity:
            raise Overloaded(
                f"server is at capacity ({self._inflight} requests in flight, limit {self.capacity}); "
                f"retry after {self.retry_after:g} s, or raise --max-inflight",
                retry_after=self.retry_after,
                why="inflight",
            )
        self._inflight += 1

    def release(self) -> None:
        self._inflight = max(0, self._inflight - 1)


def _too_large(size: int | str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body is {size} bytes, above the limit of {limit} bytes ({limit / 2**20:g} MiB)",
        field="body",
        fix="send a smaller body (downscale or re-encode the image), or start the server with a larger --max-body-mb",
    )


def check_content_length(request: Request, limit: int) -> None:
    """Refuse a declared body above ``limit`` before reading any of it."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    try:
        size = int(declared)
    except ValueError:
        return  # the server's HTTP parser rejects a malformed length itself
    if size > limit:
        raise _too_large(size, limit)


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing it as soon as more than ``limit`` bytes have arrived."""
    check_content_length(request, limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)
