"""Reading an OpenAI-compatible engine's streamed chat completion (``"stream": true``): Server-Sent
Events of ``chat.completion.chunk`` objects, ended by a ``finish_reason`` (and usage) and, on
most engines, ``data: [DONE]``.

:func:`read_chat_stream` forwards each content delta as it arrives and fails clearly, never
hangs: a line that is not an SSE field or a ``data:`` that is not JSON is a malformed stream; an
``{"error": ...}`` chunk is the engine's error; a stream that ends (or whose connection drops)
before a ``finish_reason`` or ``[DONE]`` is cut off. Silence is bounded by the HTTP client's read
timeout. :class:`CallRecorder` notes what one engine request did, as a :class:`EngineCall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import json.scanner
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from usg.errors import BackendError
from usg.records import EngineCall

#: the answer bound when the request names no max_tokens (usg.backends.openai's default)
DEFAULT_MAX_TOKENS = 256

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_LINE_BYTES",
    "CallRecorder",
    "ChatStreamReader",
    "SSEDecoder",
    "read_chat_stream",
    "stream_cut",
]

#: longest SSE line accepted from an engine (one chunk is a few hundred bytes)
MAX_LINE_BYTES = 1 << 20


class CallRecorder:
    """What one request to the engine did: its status and id, token arrival times, usage."""

    def __init__(self, model: str, url: str) -> None:
        self.model, self.url = model, url
        self.start = time.perf_counter()
        self.status = 0
        self.request_id = ""
        self.first: float | None = None
        self._last = 0.0
        self.gaps: list[float] = []
        self.deltas = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None

    def answered(self, status: int, headers: Any) -> None:
        self.status = status
        self.request_id = str(headers.get("x-request-id") or "")

    def token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self._last)
        self._last = now
        self.deltas += 1

    def chunk(self, doc: dict[str, Any]) -> None:
        """Usage, finish reason and the completion's id from one chunk (or a whole completion)."""
        if not self.request_id and isinstance(doc.get("id"), str):
            self.request_id = doc["id"]
        usage = doc.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
            self.finish_reason = str(choices[0]["finish_reason"])

    def record(self) -> EngineCall:
        return EngineCall(
            model=self.model,
            url=self.url,
            engine_request_id=self.request_id,
            status=self.status,
            start=self.start,
            end=time.perf_counter(),
            first_token=self.first,
            token_gaps_s=tuple(self.gaps),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens if self.completion_tokens is not None else self.deltas,
            finish_reason=self.finish_reason,
            error=self.error,
        )


class SSEDecoder:
    """Server-Sent Events from a byte stream fed piece by piece: :meth:`feed` returns the ``data``
    of each event it completed (lines joined with newlines), :meth:`end` checks what is left at
    the end of the stream. Lines end with ``\\n`` or ``\\r\\n``, each at most :data:`MAX_LINE_BYTES`,
    and so is the data of one event (its ``data:`` lines, held until a blank line ends it);
    comments, ``event:``, ``id:`` and ``retry:`` fields are skipped; any other line is a malformed
    stream (a :class:`BackendError` with HTTP 502)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._rest = b""
        self._data: list[str] = []
        self._size = 0  # bytes of the lines in _data
        #: lines read so far (events, comments, blank lines: what the reader bounds)
        self.lines = 0

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._rest + chunk if self._rest else chunk
        lines = buf.split(b"\n")
        self._rest = lines.pop()
        self.lines += len(lines)
        if len(self._rest) > MAX_LINE_BYTES:
            raise _bad_stream(
                f"{self.where}: the engine sent a line longer than {MAX_LINE_BYTES} bytes, not an SSE stream"
            )
        out: list[str] = []
        for raw in lines:
            if raw.startswith(b"data: ") and not raw.endswith(b"\r"):  # the usual line, quickly
                self._data.append(raw[6:].decode("utf-8", errors="replace"))
                self._size += len(raw)
            elif not raw and len(self._data) == 1:  # the usual end of an event
                out.append(self._data.pop())
                self._size = 0
            else:
                self._line(raw, out)
        if self._size > MAX_LINE_BYTES:  # an event still open (one feed is one read: at most one read over)
            raise _bad_stream(
                f"{self.where}: the engine sent an event over {MAX_LINE_BYTES} bytes (data: lines, no blank line "
                "ending it); fix: check that the engine speaks the OpenAI streaming API (or set "
                "options.engine_stream: false)"
            )
        return out

    def end(self) -> None:
        """The stream ended: a last line without its newline still counts, and an event left
        open means the stream was cut in the middle of it."""
        if self._rest:
            rest, self._rest = self._rest, b""
            self._line(rest, [])
        if self._data:
            raise stream_cut(self.where, "in the middle of an event")

    def _line(self, raw: bytes, out: list[str]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            if self._data:
                out.append("\n".join(self._data))
                self._data = []
                self._size = 0
            return
        field, sep, value = line.partition(":")
        if field == "":
            return  # a comment (keep-alive)
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
            self._size += len(raw)
        elif field not in ("event", "id", "retry") or not sep:
            raise _bad_stream(
                f"{self.where}: the engine's stream has a line that is not a Server-Sent Event field: {line[:200]!r}; "
                "fix: check that the engine speaks the OpenAI streaming API (or set options.engine_stream: false)"
            )


def _bad_stream(message: str) -> BackendError:
    """The engine broke the protocol: a 502 (a bad gateway, not our fault nor the client's)."""
    err = BackendError(message)
    err.status = 502
    return err


def stream_cut(where: str, how: str) -> BackendError:
    err = BackendError(
        f"{where}: the engine's stream ended {how}, before the answer finished (no finish_reason or [DONE]); "
        "fix: check the engine's log (it may have crashed, restarted or hit a proxy timeout)"
    )
    err.status = 502
    return err


def _malformed(where: str, data: str, why: str) -> BackendError:
    return _bad_stream(
        f"{where}: the engine sent a malformed stream chunk ({why}): {data[:200]!r}; "
        "fix: check that the engine speaks the OpenAI streaming API (or set options.engine_stream: false)"
    )


def _delta_text(doc: dict[str, Any], where: str, data: str) -> str:
    choices = doc.get("choices")
    if choices is None or choices == []:
        return ""  # a usage-only chunk (vLLM's include_usage)
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _malformed(where, data, "choices is not a list of objects")
    if "delta" not in choices[0] and isinstance(choices[0].get("text"), str):
        return str(choices[0]["text"])  # a streamed /v1/completions chunk carries its text directly
    delta = choices[0].get("delta") or {}
    if not isinstance(delta, dict):
        raise _malformed(where, data, "choices[0].delta is not an object")
    content = delta.get("content")
    return content if isinstance(content, str) else ""


class ChatStreamReader:
    """The answer of a streamed chat completion, fed the body piece by piece: :meth:`feed`
    returns the content deltas a piece completed (and notes them on ``call``), :attr:`done`
    turns true at ``data: [DONE]``, :meth:`finish` checks the end and returns the whole answer.
    Raises :class:`BackendError` (HTTP 502) for a malformed, failed or cut-off stream."""

    def __init__(self, call: CallRecorder, where: str, max_tokens: int | None = None) -> None:
        self.call, self.where = call, where
        self.done = False
        self._decoder = SSEDecoder(where)
        self._parts: list[str] = []
        # the answer's memory is bounded before it grows: an engine that ignores max_tokens (or
        # streams forever) is cut off at twice as many deltas and 1 KiB of text a token; and its
        # time: at 16 lines a token (a token's event is 2 to 4 lines, with event: and id:), so
        # empty deltas, comments or blank lines streamed in a loop do not run until the deadline
        budget = max_tokens if max_tokens is not None and max_tokens > 0 else DEFAULT_MAX_TOKENS
        self.max_deltas = 2 * budget + 16
        self.max_chars = 1024 * budget + 65536
        self.max_lines = 16 * budget + 256
        self._chars = 0

    def feed(self, chunk: bytes) -> list[str]:
        new: list[str] = []
        if self.done:
            return new
        call = self.call
        decoded = self._decoder.feed(chunk)
        if self._decoder.lines > self.max_lines:
            raise _bad_stream(
                f"{self.where}: the engine streamed over {self.max_lines} lines ({call.deltas} token deltas), "
                "past what max_tokens allows; fix: check that the engine honours max_tokens (it may be sending "
                "empty chunks or keep-alives in a loop)"
            )
        for data in decoded:
            if data == "[DONE]" or data.strip() == "[DONE]":
                self.done = True
                break
            text = _usual_chunk_text(data, call)
            if text is None:  # not the usual shape: the checks that name what is wrong
                text = _chunk_text(data, call, self.where)
            if text:
                call.token()
                self._chars += len(text)
                if call.deltas > self.max_deltas or self._chars > self.max_chars:
                    raise _bad_stream(
                        f"{self.where}: the engine streamed {call.deltas} token deltas ({self._chars} characters), "
                        f"past what max_tokens allows ({self.max_deltas} deltas, {self.max_chars} characters); "
                        "fix: check that the engine honours max_tokens"
                    )
                self._parts.append(text)
                new.append(text)
        return new

    def finish(self) -> str:
        """The answer, once the stream ended (or said ``[DONE]``)."""
        if not self.done:
            self._decoder.end()
            if self.call.finish_reason is None:
                raise stream_cut(self.where, f"after {self.call.deltas} token deltas")
        return "".join(self._parts)

    def sink(self, on_token: Callable[[str], None] | None) -> Callable[[bytes], bool]:
        """:meth:`feed` as a sink for :meth:`usg.backends.engine_http.EngineResponse.consume`:
        forwards each delta to ``on_token``, returns True at ``[DONE]``."""

        def take(chunk: bytes) -> bool:
            texts = self.feed(chunk)
            if on_token is not None:
                for text in texts:
                    on_token(text)
            return self.done

        return take


async def read_chat_stream(
    chunks: AsyncIterator[bytes],
    call: CallRecorder,
    on_token: Callable[[str], None] | None,
    where: str,
    max_tokens: int | None = None,
) -> str:
    """The whole answer of a streamed chat completion read from ``chunks``; ``on_token`` gets
    each content delta as it arrives (see :class:`ChatStreamReader`)."""
    reader = ChatStreamReader(call, where, max_tokens)
    take = reader.sink(on_token)
    async for chunk in chunks:
        if take(chunk):
            break
    if reader.done:
        await drain(chunks)
    return reader.finish()


#: json.loads without its whitespace checks (typeshed types make_scanner's argument as itself)
_scan_json: Any = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))


def _json(data: str) -> Any:
    """``json.loads(data)``, quicker for the usual chunk (no whitespace around the value)."""
    try:
        doc, end = _scan_json(data, 0)
        if end == len(data):
            return doc
    except (StopIteration, ValueError, RecursionError):
        pass
    return json.loads(data)  # whitespace around the value, or the error to raise


def _usual_chunk_text(data: str, call: CallRecorder) -> str | None:
    """:func:`_chunk_text` for the chunk every engine sends (a JSON object, no ``error``, one
    choice with a ``delta`` object), without its checks; None for anything else (then
    :func:`_chunk_text` decides). Runs once per token, so it is kept flat."""
    try:
        doc, end = _scan_json(data, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(data) or type(doc) is not dict or "error" in doc:
        return None
    choices = doc.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict:
        return None
    if not call.request_id:
        call.chunk(doc)  # the id (and anything else) of the first chunk
    else:
        if choice.get("finish_reason"):
            call.finish_reason = str(choice["finish_reason"])
        if doc.get("usage") is not None:  # not vLLM's "usage": null on every chunk
            call.chunk(doc)
    content = delta.get("content")
    return content if type(content) is str else ""


def _chunk_text(data: str, call: CallRecorder, where: str) -> str:
    """The content delta of one ``data:`` (usage, finish reason and id noted on ``call``)."""
    try:
        doc = _json(data)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser
        raise _malformed(where, data, "not JSON") from None
    if not isinstance(doc, dict):
        raise _malformed(where, data, "not a JSON object")
    if "error" in doc:
        err = doc["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raised = BackendError(f"{where}: the engine failed while generating: {str(message)[:500]}")
        raised.status = 502
        raise raised
    call.chunk(doc)
    return _delta_text(doc, where, data)


async def drain(chunks: AsyncIterator[bytes], timeout_s: float = 1.0) -> None:
    """Read what follows ``[DONE]`` (normally nothing but the end of the chunked body), so the
    engine's connection goes back to the client's pool: a response closed unread closes its
    connection, and every request would open a new one. Bounded in time and bytes (an engine
    that keeps the response open after ``[DONE]`` costs at most ``timeout_s``, then the
    connection is closed as before)."""
    left = MAX_LINE_BYTES
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                left -= len(chunk)
                if left < 0:
                    return
