"""A lean HTTP/1.1 client for the requests a ``backend: openai`` model sends to its engine.

An LLM node streams ~10 small chunks per answer from an engine that is usually next to it; with
httpx each chunk went through httpx, httpcore, h11 and anyio (about 1.5 ms of CPU per question
at 8 tokens, 2.3 ms at 32 concurrent questions, more than the rest of ``usg serve`` together).
This client parses responses with httptools (llhttp, C) inside an asyncio protocol and hands
body bytes to the reader as they arrive: ~0.3 ms per question (``benchmarks/README.md``, "LLM
overhead").

It speaks plain ``http://`` to one origin, without a proxy: :func:`lean_client_applies` says
when that holds; other engines (``https://``, or an ``HTTP_PROXY`` that applies to the URL) keep
httpx. Connections are kept alive and reused (most recently used first; one idle longer than
:data:`KEEPALIVE_S`, or closed by the engine, is dropped). ``timeout_s`` bounds the connect and
every wait for bytes. A response left before its end (an error, a cancelled request) closes its
connection, which is how the engine learns to stop generating. Failures raise
:class:`EngineTimeout` or :class:`EngineTransportError` (connect refused, connection dropped,
malformed HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

__all__ = [
    "KEEPALIVE_S",
    "EngineClient",
    "EngineResponse",
    "EngineTimeout",
    "EngineTransportError",
    "lean_client_applies",
]

#: an idle connection older than this is not reused (uvicorn, which most engines run, closes after 5 s)
KEEPALIVE_S = 4.0
#: unread body bytes at which the connection stops reading until the reader catches up
_HIGH_WATER = 1 << 22


class EngineTransportError(Exception):
    """The engine could not be reached, dropped the connection, or did not speak HTTP/1.1."""


class EngineTimeout(EngineTransportError):
    """Nothing came from the engine for ``timeout_s`` (connect, or a wait for bytes)."""


def lean_client_applies(url: str) -> bool:
    """Whether :class:`EngineClient` can talk to ``url``: plain http, no proxy for it in the
    environment (``HTTP_PROXY`` / ``ALL_PROXY``, minus ``NO_PROXY``, as httpx would use one), and
    httptools installed (``usg[llm]``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or importlib.util.find_spec("httptools") is None:
        return False
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get("http") or proxies.get("all")):
        return True
    bypass: Any = getattr(urllib.request, "proxy_bypass_environment")  # noqa: B009 (not in typeshed)
    return bool(bypass(parts.netloc, proxies))


def _parser_module() -> Any:
    try:
        import httptools
    except ImportError:
        from usg.errors import MissingDependency

        raise MissingDependency("httptools", "llm", "backend: openai") from None
    return httptools


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time. Its body is buffered for the
    reader (:meth:`EngineResponse.aiter_bytes`) or handed to a sink as it is parsed
    (:meth:`EngineResponse.consume`, no task wake-up per piece)."""

    def __init__(self, httptools: Any) -> None:
        self._httptools = httptools
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = self._httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: EngineTransportError | None = None
        self.received = 0  # response bytes so far (0: a reused connection the engine had closed)
        self.last_data = 0.0  # loop.time() of the last bytes
        self.body: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.sink: Callable[[bytes], bool] | None = None
        self.sink_done = False  # the sink wants no more (the rest is read and dropped)
        self.sink_error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except self._httptools.HttpParserError as exc:
            if self.sink_error is None:
                self.error = EngineTransportError(f"the engine's response is not valid HTTP/1.1 ({exc})")
            self.close()
        if self.sink is None or self.complete or self.error is not None or self.sink_done:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headers_done and not self.complete and self.error is None and self._close_delimited():
            self.complete = True  # a body without length or chunking ends when the connection does
        elif not self.complete and self.error is None:
            why = f": {exc}" if exc is not None else ""
            self.error = EngineTransportError(f"the engine closed the connection{why}")
        self._wake()

    def _close_delimited(self) -> bool:
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")

    # -- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            if self.sink_done or self.sink_error is not None:
                return
            try:
                self.sink_done = sink(body)
            except BaseException as exc:  # re-raised in the reading task; the connection is dropped
                self.sink_error = exc
                self.error = EngineTransportError("the response was abandoned")
                self.close()
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.keep_alive = bool(self.parser.should_keep_alive())  # llhttp forgets it once the message ends
        self.complete = True

    # -- the reader's side -------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float, *, idle: bool = True) -> None:
        """Until the connection wakes the reader (bytes, the end, a failure); :class:`EngineTimeout`
        when no bytes came for ``timeout_s`` (``idle``), or after ``timeout_s`` (not ``idle``)."""
        self.waiter = waiter = self.loop.create_future()
        since = self.loop.time()
        timer = _Timer(self, waiter, timeout_s, since, idle)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> list[bytes]:
        body, self.body, self.buffered = self.body, [], 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return body

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.error is None and not self.lost

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class _Timer:
    """Fails ``waiter`` with :class:`EngineTimeout` once the connection was silent for
    ``timeout_s`` (``idle``: bytes handed to a sink meanwhile push the deadline back)."""

    def __init__(self, conn: _Connection, waiter: asyncio.Future[None], timeout_s: float, since: float, idle: bool):
        self.conn, self.waiter, self.timeout_s, self.since, self.idle = conn, waiter, timeout_s, since, idle
        self.handle = conn.loop.call_at(since + timeout_s, self._fire)

    def _fire(self) -> None:
        if self.waiter.done():
            return
        if self.idle:
            due = max(self.since, self.conn.last_data) + self.timeout_s
            if due > self.conn.loop.time():
                self.handle = self.conn.loop.call_at(due, self._fire)
                return
        self.waiter.set_exception(EngineTimeout("timed out"))

    def cancel(self) -> None:
        self.handle.cancel()


class EngineResponse:
    """One response: ``status_code``, ``headers`` (lower-case names), and the body as it arrives
    (:meth:`aiter_bytes`), to a sink as it is parsed (:meth:`consume`) or whole (:meth:`aread`,
    then :meth:`json` / :attr:`text`)."""

    def __init__(self, conn: _Connection, timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self.status_code = conn.status
        self.headers: Mapping[str, str] = conn.headers
        self.content = b""

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.body:
                for piece in conn.take():
                    yield piece
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await self._wait()

    async def _wait(self) -> None:
        try:
            await self._conn.wait(self._timeout_s)
        except EngineTimeout:
            raise EngineTimeout(f"no bytes for {self._timeout_s:g} s") from None

    async def consume(self, sink: Callable[[bytes], bool], *, after_done_s: float = 1.0) -> None:
        """Hand each piece of the body to ``sink`` as the connection parses it (in the event
        loop's I/O callback: ``sink`` must be quick and must not block); ``sink`` returns True
        when it wants no more, and the rest of the body is then read (and dropped) for at most
        ``after_done_s``, so the connection can be reused. ``sink``'s exception is raised here."""
        conn = self._conn
        for piece in conn.take():
            if conn.sink_done:
                break
            conn.sink_done = sink(piece)
        conn.sink = sink
        deadline: float | None = None
        while True:
            if conn.sink_error is not None:
                raise conn.sink_error
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            if conn.sink_done:
                if deadline is None:
                    deadline = conn.loop.time() + after_done_s
                left = deadline - conn.loop.time()
                if left <= 0:
                    return  # the engine keeps the response open: the connection is closed, not reused
                try:
                    await conn.wait(left, idle=False)
                except EngineTimeout:
                    return
                continue
            await self._wait()

    async def aread(self) -> bytes:
        self.content = b"".join([piece async for piece in self.aiter_bytes()])
        return self.content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class EngineClient:
    """Keep-alive HTTP/1.1 to one ``http://host:port`` origin (see the module docstring); the
    method names and arguments follow httpx's, so the backend drives either client."""

    def __init__(self, origin: str, timeout_s: float, max_idle: int) -> None:
        parts = urllib.parse.urlsplit(origin)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"EngineClient speaks plain http to one origin, not {origin!r}")
        self.origin = f"http://{parts.netloc}"
        self._host = parts.hostname
        self._port = parts.port or 80
        self._host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        self.timeout_s = timeout_s
        self.max_idle = max(1, max_idle)
        self._idle: list[_Connection] = []
        self._httptools = _parser_module()
        self._closed = False

    def _target(self, url: str) -> bytes:
        if not url.startswith(self.origin) or url[len(self.origin) : len(self.origin) + 1] not in ("/", ""):
            raise ValueError(f"{url!r} is not at {self.origin}")
        return (url[len(self.origin) :] or "/").encode("ascii")

    def _head(self, method: str, url: str, headers: Mapping[str, str] | None, length: int | None) -> bytes:
        lines = [f"{method} ".encode() + self._target(url) + b" HTTP/1.1", b"Host: " + self._host_header]
        lines.append(b"Accept: */*")
        lines.append(b"User-Agent: usg")
        if length is not None:
            lines.append(b"Content-Type: application/json")
            lines.append(b"Content-Length: %d" % length)
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}".encode("latin-1"))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(self._httptools), self._host, self._port)
        except TimeoutError:
            raise EngineTimeout(f"connecting to {self._host}:{self._port} took over {self.timeout_s:g} s") from None
        except OSError as exc:
            raise EngineTransportError(f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}") from None
        return conn

    def _pooled(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            stale = now - conn.idle_since > KEEPALIVE_S or conn.received  # bytes while idle: not clean
            if stale or conn.lost or conn.transport is None or conn.transport.is_closing():
                conn.close()
                continue
            return conn
        return None

    def _release(self, conn: _Connection) -> None:
        if self._closed or not conn.reusable or len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conn._reset()
        self._idle.append(conn)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, url: str, *, json: Any = None, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[EngineResponse]:
        """Send the request; the response's headers have arrived when this yields. Leaving the
        block before the body ended closes the connection."""
        if self._closed:
            raise EngineTransportError("the client is closed")
        body = _dumps(json) if json is not None else b""
        request = self._head(method, url, headers, len(body) if json is not None else None) + body
        conn = self._pooled()
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect()
            try:
                await self._send(conn, request)
            except EngineTransportError:
                conn.close()
                if reused and conn.received == 0 and not isinstance(conn.error, EngineTimeout):
                    conn, reused = None, False  # the engine had closed that idle connection: once more, anew
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            break
        try:
            yield EngineResponse(conn, self.timeout_s)
        except BaseException:
            conn.close()
            raise
        if conn.complete:
            self._release(conn)
        else:
            conn.close()

    async def _send(self, conn: _Connection, request: bytes) -> None:
        assert conn.transport is not None
        conn.transport.write(request)
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            try:
                await conn.wait(self.timeout_s)
            except EngineTimeout:
                conn.error = EngineTimeout(f"no response within {self.timeout_s:g} s")
                raise conn.error from None

    async def request(
        self, method: str, url: str, *, json: Any = None, headers: Mapping[str, str] | None = None
    ) -> EngineResponse:
        async with self.stream(method, url, json=json, headers=headers) as resp:
            await resp.aread()
        return resp

    async def get(self, url: str, *, headers: Mapping[str, str] | None = None) -> EngineResponse:
        return await self.request("GET", url, headers=headers)

    async def post(self, url: str, *, json: Any = None, headers: Mapping[str, str] | None = None) -> EngineResponse:
        return await self.request("POST", url, json=json, headers=headers)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
