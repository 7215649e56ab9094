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
:data:`KEEPALIVE_S`, closed by the engine, or with bytes waiting while idle, is dropped before a
request is written to it). Only a connection whose response was read to its end goes back to
the pool: a response left before its end (an error, a cancelled request) closes its connection,
which is how the engine learns to stop generating.

What an engine may not do to it, each an :class:`EngineTransportError` naming the engine
(:class:`EngineProtocolError` for the last two):

* time: ``timeout_s`` bounds the connect, the wait for the response's head (in total, so a head
  dripped a byte at a time cannot hold the request), every wait for bytes of a streamed body,
  and the whole of a body read at once (:meth:`EngineResponse.aread`): :class:`EngineTimeout`;
* memory: a head over :data:`MAX_HEAD_BYTES`, a body read at once over :data:`MAX_BODY_BYTES`
  (a streamed body is handed on as it arrives and never held);
* HTTP: malformed responses, ``101`` (nothing here asks to switch protocols), a second response
  nobody asked for. Interim ``1xx`` responses (``100``, ``103``) are skipped; ``204`` and
  ``304`` have no body.

A pooled connection the engine closed while the request was being written is replaced once,
only where sending again cannot run the request twice: a ``GET``, or a request the engine
reset without reading (connection reset or broken pipe before a byte of answer). A connection
that ends cleanly without an answer after a ``POST`` was written is an error: the engine may
have taken the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import select
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

__all__ = [
    "KEEPALIVE_S",
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "EngineClient",
    "EngineProtocolError",
    "EngineResponse",
    "EngineTimeout",
    "EngineTransportError",
    "lean_client_applies",
]

#: an idle connection older than this is not reused (uvicorn, which most engines run, closes after 5 s)
KEEPALIVE_S = 4.0
#: unread body bytes at which the connection stops reading until the reader catches up
_HIGH_WATER = 1 << 22
#: longest response head (status line and headers, interim 1xx heads included) taken from an engine
MAX_HEAD_BYTES = 64 * 1024
#: longest body read whole (a non-streamed completion, an error, ``/v1/models``); streamed bodies pass through
MAX_BODY_BYTES = 16 * 1024 * 1024


class EngineTransportError(Exception):
    """The engine could not be reached, dropped the connection, or did not speak HTTP/1.1."""


class EngineProtocolError(EngineTransportError):
    """The engine answered, but not as HTTP/1.1 allows or within the size limits (a bad gateway)."""


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

    def __init__(self, httptools: Any, origin: str) -> None:
        self._httptools = httptools
        self.origin = origin
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
        self.reset = False  # the engine reset the connection (it did not read what was sent)
        self.interim = False  # parsing a 1xx head, skipped
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
        except (self._httptools.HttpParserError, self._httptools.HttpParserUpgrade) as exc:
            self.fail(
                f"the response of the engine at {self.origin} is not valid HTTP/1.1 ({exc}); "
                "fix: check that options.url is the engine's HTTP address"
            )
        if not self.headers_done and self.received > MAX_HEAD_BYTES and self.error is None:
            self.fail(
                f"the engine at {self.origin} sent a response head over {MAX_HEAD_BYTES} bytes; "
                "fix: check what listens at options.url (an engine's head is a few hundred bytes)"
            )
        if self.sink is None or self.complete or self.error is not None or self.sink_done:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reset = isinstance(exc, (ConnectionResetError, BrokenPipeError))
        if self.headers_done and not self.complete and self.error is None and self._close_delimited():
            self.complete = True  # a body without length or chunking ends when the connection does
        elif not self.complete and self.error is None:
            why = f": {exc}" if exc is not None else ""
            self.error = EngineTransportError(f"the engine at {self.origin} closed the connection{why}")
        self._wake()

    def fail(self, message: str) -> None:
        """The response is unusable: the reader gets ``message``; the connection is closed."""
        if self.sink_error is None and self.error is None:
            self.error = EngineProtocolError(message)
        self.close()

    def _close_delimited(self) -> bool:
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")

    # -- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:  # a second response in the same read: nobody asked for it
            self.keep_alive = False
            self.fail(f"the engine at {self.origin} sent a response nobody asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return  # of a response nobody asked for (refused in on_message_begin)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if status == 101:
            self.fail(
                f"the response of the engine at {self.origin} is not valid HTTP/1.1 "
                "(it switched protocols (HTTP 101), which nothing here asked for)"
            )
            return
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the real head follows
            self.interim = True
            self.headers = {}
            return
        self.status = status
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
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
        if self.complete:
            return
        if self.interim:
            self.interim = False
            return
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

    def idle_and_clean(self) -> bool:
        """A pooled connection still open with nothing to read (a FIN or stray bytes not yet
        seen by the event loop make its socket readable): one ``poll``-like syscall."""
        transport = self.transport
        if self.lost or self.received or transport is None or transport.is_closing():
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return True
        try:
            poller = select.poll()  # not select.select: no limit on the descriptor's number
            poller.register(sock.fileno(), select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

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
            raise EngineTimeout(f"no bytes from the engine at {self._conn.origin} for {self._timeout_s:g} s") from None

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
        """The whole body, at most :data:`MAX_BODY_BYTES`, within ``timeout_s`` in total (an
        engine dripping bytes cannot hold it longer)."""
        conn = self._conn
        if conn.complete and conn.error is None:  # all of it arrived with the head: nothing to wait for
            pieces = conn.take()
            if sum(map(len, pieces)) > MAX_BODY_BYTES:
                conn.close()
                raise self._too_large()
            self.content = b"".join(pieces)
            return self.content
        pieces = []
        size = 0
        try:
            async with asyncio.timeout(self._timeout_s):
                async for piece in self.aiter_bytes():
                    size += len(piece)
                    if size > MAX_BODY_BYTES:
                        self._conn.close()
                        raise self._too_large()
                    pieces.append(piece)
        except TimeoutError:
            self._conn.close()
            raise EngineTimeout(
                f"the body from the engine at {self._conn.origin} took over {self._timeout_s:g} s"
            ) from None
        self.content = b"".join(pieces)
        return self.content

    def _too_large(self) -> EngineProtocolError:
        return EngineProtocolError(
            f"the engine at {self._conn.origin} sent a body over {MAX_BODY_BYTES} bytes "
            f"(HTTP {self.status_code}); fix: check what listens at options.url, or lower max_tokens"
        )

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
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._httptools, self.origin), self._host, self._port
                )
        except TimeoutError:
            raise EngineTimeout(f"connecting to {self.origin} took over {self.timeout_s:g} s") from None
        except OSError as exc:
            raise EngineTransportError(f"cannot connect to {self.origin}: {exc.strerror or exc}") from None
        return conn

    def _pooled(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since > KEEPALIVE_S or not conn.idle_and_clean():
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
        conn = await self._open(method, url, json, headers)
        try:
            yield EngineResponse(conn, self.timeout_s)
        finally:
            self._done(conn)

    async def _open(self, method: str, url: str, json: Any, headers: Mapping[str, str] | None) -> _Connection:
        """Send the request on a pooled (or new) connection; the connection once the response's
        head has arrived (:meth:`_done` returns it to the pool or closes it)."""
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
                if reused and _unanswered(conn) and (method in ("GET", "HEAD") or conn.reset):
                    conn, reused = None, False  # the engine had closed that idle connection: once more, anew
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return conn

    def _done(self, conn: _Connection) -> None:
        """A response left: one read to its end (say, an error the caller raises on) keeps its
        connection, any other closes it."""
        if conn.complete:
            self._release(conn)
        else:
            conn.close()

    async def _send(self, conn: _Connection, request: bytes) -> None:
        """Write ``request``; return once the response's head has arrived (within ``timeout_s``)."""
        assert conn.transport is not None
        conn.transport.write(request)
        deadline = conn.loop.time() + self.timeout_s
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            try:
                await conn.wait(deadline - conn.loop.time(), idle=False)
            except EngineTimeout:
                conn.error = EngineTimeout(
                    f"no response head from the engine at {self.origin} within {self.timeout_s:g} s"
                )
                raise conn.error from None

    async def request(
        self, method: str, url: str, *, json: Any = None, headers: Mapping[str, str] | None = None
    ) -> EngineResponse:
        # the body read at once: no context manager (its async generator and frames cost as much as
        # the rest of a pooled request's Python; benchmarks/README.md "LLM overhead", session 15)
        conn = await self._open(method, url, json, headers)
        try:
            resp = EngineResponse(conn, self.timeout_s)
            await resp.aread()
        finally:
            self._done(conn)
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


def _unanswered(conn: _Connection) -> bool:
    """The connection ended before a byte of answer, not by a timeout nor by a protocol error."""
    return conn.received == 0 and conn.lost and not isinstance(conn.error, EngineTimeout)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
