"""What a running request tells a streaming caller as it goes: each node that finished, each
token delta an LLM node received from its engine, and at the end the result.

:meth:`usg.runtime.Executor.stream` yields these; :meth:`~usg.runtime.Executor.infer` takes an
``events`` callback (an :data:`EventSink`) that gets the same records as they happen. Nothing
here is global: each request has its own sink, and nodes only see a per-node token callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from usg.runtime.result import InferResult

__all__ = [
    "EventSink",
    "ExecutionEvent",
    "Finished",
    "NodeFinished",
    "TokenCallback",
    "TokenDelta",
    "stream_event_batches",
    "stream_events",
]


@dataclass(frozen=True)
class NodeFinished:
    """A node of the request ran to completion (nodes pruned or skipped send nothing)."""

    node: str
    ms: float


@dataclass(frozen=True)
class TokenDelta:
    """A piece of text an LLM node's engine streamed (in order, per node)."""

    node: str
    text: str


@dataclass(frozen=True)
class Finished:
    """The request's result: the very object :meth:`~usg.runtime.Executor.infer` returns."""

    result: InferResult


ExecutionEvent = NodeFinished | TokenDelta | Finished
#: receives a request's events on the event loop, as they happen; must not block
EventSink = Callable[[NodeFinished | TokenDelta], None]
#: receives one LLM node's token deltas (the executor binds the node's name)
TokenCallback = Callable[[str], None]


async def stream_events(run: Callable[[EventSink], Awaitable[InferResult]]) -> AsyncGenerator[ExecutionEvent, None]:
    """Run ``run(sink)`` as a task and yield its events, then :class:`Finished`; its error is
    raised here. Closing the iterator early (the client went away) cancels the run, which
    closes its engine connections. The buffer holds at most what the request produces (its
    nodes and its engines' ``max_tokens``), so it is bounded by the request itself.
    (:func:`stream_event_batches`, one event at a time.)"""
    batches = stream_event_batches(run)
    try:
        async for batch in batches:
            for event in batch:
                yield event
    finally:
        await batches.aclose()


async def stream_event_batches(
    run: Callable[[EventSink], Awaitable[InferResult]],
) -> AsyncGenerator[list[ExecutionEvent], None]:
    """:func:`stream_events`, each wake-up's events as one list (never empty, in order; the last
    one ends with :class:`Finished`): what arrived while the reader was busy (a slow client, a
    loaded event loop, an engine read that held several deltas) is handed over at once, so a
    server can write it as one piece. A lone event is handed over as soon as it arrives.

    Per token this is the cheapest hand-over asyncio has: the sink appends to a list and wakes
    the reader only when it sleeps (one future a wake-up, not a queue's per item); the reader
    takes everything buffered at once, and a finished run ends the iterator in the same loop
    step as its result (no wait on a task that is already done)."""
    loop = asyncio.get_running_loop()
    buffer: list[ExecutionEvent] = []
    waiter: list[asyncio.Future[None] | None] = [None]

    def wake(_arg: object = None) -> None:
        fut = waiter[0]
        if fut is not None:
            waiter[0] = None
            if not fut.done():
                fut.set_result(None)

    def sink(event: NodeFinished | TokenDelta) -> None:
        buffer.append(event)
        if waiter[0] is not None:
            wake()

    task = asyncio.ensure_future(run(sink))
    task.add_done_callback(wake)
    try:
        while True:
            if task.done():
                break
            if buffer:
                ready = buffer[:]
                buffer.clear()
                yield ready
                continue
            fut = waiter[0] = loop.create_future()
            await fut
        ready = buffer[:]
        buffer.clear()
        if not task.cancelled() and task.exception() is None:
            ready.append(Finished(task.result()))
            yield ready
            return
        if ready:
            yield ready
        task.result()  # the run's error, raised here after the events that came before it
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif not task.cancelled():
            task.exception()  # retrieved: its error was raised above, or nobody waits
