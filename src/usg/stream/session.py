"""Streaming sessions: timestamped chunks in, events out, per-stream state carried between chunks.

A :class:`SessionManager` serves sessions on one running :class:`~usg.runtime.Executor`. Each
:class:`Session` runs its chunks in order — one executor run per chunk, with the session's
:class:`~usg.runtime.streams.StreamState` (stateful models' states, Python nodes'
``session_state``) — so chunks of different sessions meet in the models' batchers and share
calls, while each stream sees its own state. Per chunk it emits:

- each item of an *event output* (default: the graph output ``events``; items are dicts with a
  ``type``, e.g. ``speech_start``) as its own event, with the chunk's ``seq``;
- a ``result`` event with the chunk's other outputs (``{"type": "result", "seq", "input",
  "ts_ms", "outputs"}``), when it has any; audio chunks that waited behind one another are run
  as one (``first_seq`` .. ``seq``), so a session that fell behind catches up;
- an ``error`` event (``status``, ``message``, ``field``, ``fix``) when the run failed; the
  session goes on with its next chunk.

:meth:`Session.close` runs the chunks still pending, then a flush run (each audio input that
got chunks, with no samples and ``flush`` set: remainders are padded out, open segments end),
then emits ``closed``. Limits and backpressure: :class:`~usg.stream.limits.SessionLimits`.
An idle session holds no task: a chunk starts one, which ends when the session's queue is empty.

A chunk of samples for a mono audio input is checked when it is sent (:func:`check_audio_chunk`:
what decoding would check of it) and runs through :meth:`usg.runtime.Executor.run_chunk`, the
executor's lean run of a stream's chunk (:mod:`usg.runtime.chunks`); other chunks (encoded audio,
images, text) run through :meth:`~usg.runtime.Executor.infer`. Both give the same events.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import numpy as np

from usg.errors import BackendError, InputError, Overloaded, PayloadTooLarge, StateError, USGError
from usg.ops.audio import all_finite
from usg.runtime import Executor
from usg.runtime.result import to_jsonable
from usg.runtime.streams import StreamState
from usg.specs import AudioSpec, Modality
from usg.stream.limits import SessionLimits

__all__ = ["Chunk", "EventQueue", "Session", "SessionManager", "check_audio_chunk", "error_event"]

_ids = itertools.count(1)
log = logging.getLogger("usg.stream")


class Chunk(NamedTuple):
    """One chunk: the graph input it is for, its value, its capture time in ms, its number
    (a named tuple: one is built per chunk, and a frozen dataclass costs several times more)."""

    input: str
    value: Any
    ts_ms: float
    seq: int
    received: float  # perf_counter() when it was accepted
    flush: bool = False
    first_seq: int | None = None  # chunks joined into one run: seq first_seq..seq

    @property
    def seqs(self) -> list[int]:
        return [self.seq] if self.first_seq is None else list(range(self.first_seq, self.seq + 1))


def error_event(exc: USGError, **extra: Any) -> dict[str, Any]:
    """The ``error`` event of a failure: status, message, field and fix (when the error has them)."""
    body = exc.to_dict()
    return {
        "type": "error",
        "status": exc.status,
        "code": type(exc).__name__,
        "message": str(body.get("message", exc)),
        "field": body.get("field"),
        "fix": body.get("fix"),
        **({"retry_after_s": exc.retry_after} if isinstance(exc, Overloaded) else {}),
        **extra,
    }


class EventQueue:
    """A session's events not read yet: a bounded FIFO with asyncio.Queue's ``put`` / ``get``
    (and its handling of a cancelled waiter), without the task accounting a session does not use;
    its waiter lists are made when first needed, so an idle session holds one deque."""

    __slots__ = ("_getters", "_items", "_putters", "maxsize")

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize  # <= 0: unbounded
        self._items: collections.deque[dict[str, Any]] = collections.deque()
        self._getters: collections.deque[asyncio.Future[None]] | None = None
        self._putters: collections.deque[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put_nowait(self, item: dict[str, Any]) -> None:
        if self.full():
            raise asyncio.QueueFull
        self._items.append(item)
        if self._getters:
            _wake_next(self._getters)

    def get_nowait(self) -> dict[str, Any]:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if self._putters:
            _wake_next(self._putters)
        return item

    async def put(self, item: dict[str, Any]) -> None:
        while self.full():
            if self._putters is None:
                self._putters = collections.deque()
            await _wait(self._putters, lambda: not self.full())
        self.put_nowait(item)

    async def get(self) -> dict[str, Any]:
        while not self._items:
            if self._getters is None:
                self._getters = collections.deque()
            await _wait(self._getters, lambda: bool(self._items))
        return self.get_nowait()


async def _wait(waiters: collections.deque[asyncio.Future[None]], ready: Any) -> None:
    """Wait in line; a waiter cancelled after it was woken passes the turn on (as asyncio.Queue)."""
    waiter = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        await waiter
    except BaseException:
        waiter.cancel()
        with contextlib.suppress(ValueError):  # a put or get may have taken it off the line already
            waiters.remove(waiter)
        if ready() and not waiter.cancelled():
            _wake_next(waiters)
        raise


def _wake_next(waiters: collections.deque[asyncio.Future[None]]) -> None:
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return


class Session:
    """One stream of chunks; created by :meth:`SessionManager.open`."""

    __slots__ = (
        "_closed",
        "_events",
        "_full_since",
        "_manager",
        "_pending",
        "_seq",
        "_task",
        "_tokens",
        "_touched",
        "_used",
        "id",
        "last_active",
        "state",
    )

    def __init__(self, manager: SessionManager, sid: str) -> None:
        self.id = sid
        self._manager = manager
        self.state = StreamState(flush=False, sequential=True)
        self._pending: collections.deque[Chunk] = collections.deque()
        self._events = EventQueue(manager.limits.max_pending_events)
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self._tokens = float(manager.limits.burst)
        self._touched = self.last_active = time.monotonic()
        self._used: set[str] = set()  # audio inputs that got chunks (flushed on close)
        self._closed = False
        self._full_since: float | None = None

    # -- sending -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_chunks(self) -> int:
        return len(self._pending)

    @property
    def pending_events(self) -> int:
        return self._events.qsize()

    def send(self, name: str, value: Any, ts_ms: float) -> int:
        """Accept a chunk for input ``name`` captured at ``ts_ms``; returns its ``seq``.

        Audio is float32 samples at the input's ``sample_rate`` (mono; see :mod:`usg.stream.wire`
        for PCM16 frames), an image its encoded bytes, text a string. Raises (and the chunk is
        not taken) when the session is closed, the chunk is too big, comes too fast, or the
        session has ``max_pending_chunks`` waiting."""
        limits = self._manager.limits
        if self._closed:
            raise StateError(f"session {self.id} is closed; fix: open a new session")
        d = self._manager.executor.graph.inputs.get(name)
        if d is None:
            raise InputError(
                f"session {self.id}: unknown input {name!r}",
                field="input",
                fix=f"send chunks for one of: {', '.join(sorted(self._manager.executor.graph.inputs))}",
            )
        size = _size(value)
        if size > limits.max_chunk_bytes:
            raise PayloadTooLarge(
                f"session {self.id}: a chunk of {size} bytes for {name!r} is above the session limit of "
                f"{limits.max_chunk_bytes} bytes",
                field="chunk",
                fix="send smaller chunks (e.g. 20-100 ms of audio), or raise --stream-limit max_chunk_bytes",
            )
        now = time.monotonic()
        self._tokens = min(float(limits.burst), self._tokens + (now - self._touched) * limits.max_chunks_per_s)
        self._touched = now
        if self._tokens < 1.0:
            raise Overloaded(
                f"session {self.id}: chunks arrive faster than {limits.max_chunks_per_s:g}/s "
                f"(burst {limits.burst}); this chunk was dropped",
                retry_after=1.0 / limits.max_chunks_per_s,
                why="stream_rate",
                fix=f"send at most {limits.max_chunks_per_s:g} chunks a second (longer chunks, e.g. 100 ms of "
                "audio each), or raise --stream-limit max_chunks_per_s=N (and burst=N)",
            )
        if len(self._pending) >= limits.max_pending_chunks:
            slow = self._events.full()
            raise Overloaded(
                f"session {self.id}: {len(self._pending)} chunks are waiting to run (limit "
                f"{limits.max_pending_chunks}); "
                + (f"the reader is behind: {self._events.qsize()} events unread" if slow else "the models are behind"),
                retry_after=0.1,
                why="stream_backlog",
                fix="read events faster" if slow else "send slower or add capacity",
            )
        if d.modality is Modality.AUDIO:
            value = check_audio_chunk(name, value)
            self._used.add(name)
        self._tokens -= 1.0
        self.last_active = now
        return self._enqueue(name, value, ts_ms)

    def _enqueue(self, name: str, value: Any, ts_ms: float, *, flush: bool = False) -> int:
        self._seq += 1
        self._pending.append(Chunk(name, value, float(ts_ms), self._seq, time.perf_counter(), flush))
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=f"session:{self.id}")
        return self._seq

    # -- running -----------------------------------------------------------------------------
    async def _pump(self) -> None:
        try:
            while self._pending:
                await self._run(self._take())
        finally:
            self._task = None

    def _take(self) -> Chunk:
        """The next chunk; audio chunks of one input waiting behind it join it (up to
        ``coalesce_chunks``): one run instead of several, the same samples in the same order, so
        a session that fell behind catches up instead of paying the per-run cost per chunk."""
        chunk = self._pending.popleft()
        if not self._pending or chunk.flush:
            return chunk
        limit = self._manager.limits.coalesce_chunks
        audio = chunk.input in self._used and isinstance(chunk.value, np.ndarray)  # decoded audio only
        if limit <= 1 or not audio:
            return chunk
        parts = [chunk.value]
        last = chunk
        spec = self._manager.audio_specs[chunk.input]
        samples = chunk.value.shape[0]
        while self._pending and len(parts) < limit:
            nxt = self._pending[0]
            if nxt.flush or nxt.input != chunk.input or not isinstance(nxt.value, np.ndarray):
                break
            samples += nxt.value.shape[0]
            if samples / spec.sample_rate > spec.max_seconds:  # joined they would be too long; alone they are not
                break
            parts.append(self._pending.popleft().value)
            last = nxt
        if len(parts) == 1:
            return chunk
        return Chunk(chunk.input, np.concatenate(parts), chunk.ts_ms, last.seq, chunk.received, first_seq=chunk.seq)

    async def _run(self, chunk: Chunk) -> None:
        self.state.ts_ms, self.state.flush = chunk.ts_ms, chunk.flush
        meta: dict[str, Any] = {"seq": chunk.seq, "input": chunk.input, "ts_ms": chunk.ts_ms}
        if chunk.first_seq is not None:
            meta["first_seq"] = chunk.first_seq
        manager = self._manager
        executor = manager.executor
        rid = f"{self.id}:{chunk.seq}"
        try:
            if chunk.flush or manager.checked(chunk.input, chunk.value):  # the executor's lean chunk run
                result = await executor.run_chunk({chunk.input: chunk.value}, self.state, rid)
            else:
                result = await executor.infer({chunk.input: chunk.value}, stream=self.state, request_id=rid)
        except USGError as exc:
            await self._emit(error_event(exc, **meta))
            return
        except Exception as exc:  # a bug: say so on the stream, keep the session going
            log.exception("session %s: chunk %d failed", self.id, chunk.seq)
            await self._emit(error_event(BackendError(f"internal error ({type(exc).__name__})"), **meta))
            return
        outputs = result.outputs
        events_out = manager.event_outputs
        try:  # an output JSON cannot carry: this chunk's error event, as a failed run's (before anything is sent)
            events = [
                {**to_jsonable(item, f"output {name!r}[{i}]"), **meta, "ts_ms": item.get("ts_ms", chunk.ts_ms)}
                for name in events_out
                for i, item in enumerate(outputs.get(name) or ())
            ]
            rest = {k: v for k, v in outputs.items() if k not in events_out and not _empty(v)}
            if rest:
                events.append(
                    {"type": "result", **meta, "outputs": {k: to_jsonable(v, f"output {k!r}") for k, v in rest.items()}}
                )
        except USGError as exc:
            await self._emit(error_event(exc, **meta))
            return
        for event in events:
            if not self._offer(event):
                await self._emit(event)

    def _offer(self, event: dict[str, Any]) -> bool:
        """Queue an event if there is room (False: :meth:`_emit` waits for it)."""
        events = self._events
        if self._full_since is not None or events.full():
            return False
        events.put_nowait(event)
        return True

    async def _emit(self, event: dict[str, Any]) -> None:
        """Queue an event; when the queue is full, wait (the session stops running chunks)."""
        events = self._events
        if not events.full():
            events.put_nowait(event)
        else:
            self._full_since = self._full_since or time.monotonic()
            await events.put(event)
        if self._full_since is not None and not events.full():
            self._full_since = None

    def reader_stalled(self, now: float) -> bool:
        """The event queue has been full longer than ``slow_reader_s``."""
        return self._full_since is not None and now - self._full_since > self._manager.limits.slow_reader_s

    # -- receiving ---------------------------------------------------------------------------
    async def next_event(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The next event (waits up to ``timeout_s``; TimeoutError past it)."""
        events = self._events
        if events.qsize():
            event = events.get_nowait()
        elif timeout_s is None:
            event = await events.get()
        else:
            event = await asyncio.wait_for(events.get(), timeout_s)
        if self._full_since is not None and not events.full():
            self._full_since = None
        return event

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Events as they come, up to and including ``closed``."""
        while True:
            event = await self.next_event()
            yield event
            if event["type"] == "closed":
                return

    # -- closing -----------------------------------------------------------------------------
    async def close(self, reason: str = "client") -> None:
        """Flush: run the pending chunks, then the flush run, then emit ``closed``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in sorted(self._used):
            self._enqueue(name, np.zeros(0, np.float32), self.state.ts_ms, flush=True)
        task = self._task
        if task is not None:
            await asyncio.shield(task)
        await self._emit({"type": "closed", "reason": reason, "chunks": self._seq})
        self._manager.forget(self)

    def abort(self) -> None:
        """Drop the session without flushing (its reader is gone)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._pending.clear()
        self._manager.forget(self)


def check_audio_chunk(name: str, value: Any) -> Any:
    """An audio chunk checked when it is sent (so a bad one never joins its neighbours' run): mono
    float32 samples, finite, contiguous — the checks decoding would make of it, so a chunk of an
    input with ``channels: 1`` runs without them (:meth:`usg.runtime.Executor.run_chunk`); its
    length against ``max_seconds`` is the run's (:attr:`SessionManager.max_samples`)."""
    if not isinstance(value, np.ndarray):
        return value  # encoded audio: decoded (and checked) by the run
    if value.ndim != 1 or value.dtype != np.float32 or value.shape[0] == 0:
        raise InputError(
            f"{name}: audio chunk is {value.dtype}{list(value.shape)}",
            field=name,
            fix="send mono float32 samples at the input's sample_rate, shape [samples] (or PCM16 frames over the wire)",
        )
    if not all_finite(value):
        raise InputError(f"{name}: audio chunk has NaN or infinite samples", field=name, fix="send finite samples")
    return np.ascontiguousarray(value)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple, dict)) and not value)


def _size(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return 0


class SessionManager:
    """Opens and tracks the sessions on one executor; closes idle ones.

    ``event_outputs``: graph outputs whose items are sent as events of their own (default
    ``("events",)``). Start the idle reaper with :meth:`start` (``async with`` does it)."""

    def __init__(
        self,
        executor: Executor,
        limits: SessionLimits | None = None,
        *,
        event_outputs: tuple[str, ...] = ("events",),
    ) -> None:
        self.executor = executor
        self.limits = limits or SessionLimits()
        self.event_outputs = event_outputs
        #: the audio inputs' specs (rate, channels, max_seconds), as decoding applies them
        self.audio_specs = {
            n: d.audio or AudioSpec() for n, d in executor.graph.inputs.items() if d.modality is Modality.AUDIO
        }
        self.sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.idle_closed = 0

    def open(self, session_id: str | None = None) -> Session:
        """A new session (429 past ``max_sessions``)."""
        if len(self.sessions) >= self.limits.max_sessions:
            raise Overloaded(
                f"{len(self.sessions)} sessions are open (limit {self.limits.max_sessions})",
                retry_after=1.0,
                why="stream_sessions",
                fix="retry later, close idle sessions, or raise --stream-limit max_sessions",
            )
        sid = session_id or f"s{next(_ids)}"
        session = Session(self, sid)
        self.sessions[sid] = session
        return session

    def checked(self, name: str, value: Any) -> bool:
        """Whether a chunk needs no more checks to run: samples of a mono audio input, checked when
        sent (:func:`check_audio_chunk`), within the input's ``max_seconds``."""
        spec = self.audio_specs.get(name)
        return (
            spec is not None
            and spec.channels == 1
            and isinstance(value, np.ndarray)
            and value.shape[0] / spec.sample_rate <= spec.max_seconds
        )

    def forget(self, session: Session) -> None:
        self.sessions.pop(session.id, None)

    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap(), name="sessions:idle")

    async def aclose(self) -> None:
        """Close (flush) every open session — one whose reader does not take its events within
        ``slow_reader_s`` is dropped — then stop the reaper."""

        async def close(s: Session) -> None:
            try:
                await asyncio.wait_for(s.close("server"), self.limits.slow_reader_s)
            except TimeoutError:
                s.abort()

        await asyncio.gather(*(close(s) for s in list(self.sessions.values())), return_exceptions=True)
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None

    async def __aenter__(self) -> SessionManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _reap(self) -> None:
        period = max(0.05, min(1.0, self.limits.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if not s.closed and s.pending_chunks == 0 and now - s.last_active > self.limits.idle_timeout_s:
                    self.idle_closed += 1
                    task = asyncio.get_running_loop().create_task(s.close("idle_timeout"))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
