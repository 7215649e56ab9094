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

__all__ = ["EventSink", "ExecutionEvent", "Finished", "NodeFinished", "TokenCallback", "TokenDelta", "stream_events"]


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

_DONE = object()


async def stream_events(run: Callable[[EventSink], Awaitable[InferResult]]) -> AsyncGenerator[ExecutionEvent, None]:
    """Run ``run(sink)`` as a task and yield its events, then :class:`Finished`; its error is
    raised here. Closing the iterator early (the client went away) cancels the run, which
    closes its engine connections. The queue holds at most what the request produces (its
    nodes and its engines' ``max_tokens``), so it is bounded by the request itself."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    task = asyncio.ensure_future(run(queue.put_nowait))
    task.add_done_callback(lambda _t: queue.put_nowait(_DONE))
    try:
        while True:
            event = await queue.get()
            if event is _DONE:
                break
            assert isinstance(event, NodeFinished | TokenDelta)
            yield event
        yield Finished(task.result())
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its error was raised above, or nobody waits
