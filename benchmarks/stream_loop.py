"""Event-loop CPU per chunk of streaming sessions (closed loop), the lean chunk run vs the request path.

``--sessions`` sessions on ``examples/speech_stream/graph.yaml`` (silero-vad batched across them)
each send one 32 ms chunk (512 samples of espeak-ng speech) per tick, all at once; the next tick
starts when every chunk's result came back. The event loop is one thread and every session's
Python runs on it, so its CPU time per chunk (``time.thread_time`` of that thread, readers
included) bounds the streams one process carries while the model calls run on worker threads.
Two ways of running a session's chunks, alternating round by round in the same process:

- ``run_chunk``: what sessions do — :meth:`usg.runtime.Executor.run_chunk`, the lean run of a
  chunk checked when it was sent (:mod:`usg.runtime.chunks`);
- ``infer``: the same chunks through :meth:`usg.runtime.Executor.infer` (the request path:
  inputs decoded and checked again, a plan per request, ``asyncio.timeout``), as sessions ran them
  before the lean run existed.

Prints µs of event-loop CPU per chunk per round and the ratio of the medians. No pass/fail.

Run: python benchmarks/stream_loop.py [--sessions 64] [--ticks 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
from streaming import CHUNK, GRAPH, speech

from usg.graph import load_graph
from usg.runtime import Executor
from usg.stream import SessionLimits, SessionManager


class RequestPathSessions(SessionManager):
    """Sessions whose chunks all run through Executor.infer (the request path)."""

    def checked(self, name: str, value: Any) -> bool:
        return False


async def closed_loop(manager: SessionManager, audio: np.ndarray, sessions: int, ticks: int) -> float:
    """Event-loop CPU µs per chunk of ``ticks`` rounds of one chunk per session."""
    opened = [manager.open() for _ in range(sessions)]
    got = 0
    need = 0
    all_in = asyncio.Event()

    async def read(session: Any) -> None:
        nonlocal got
        async for event in session.events():
            if event["type"] == "error":
                raise RuntimeError(event)
            if event["type"] == "result":
                got += 1
                if got >= need:
                    all_in.set()

    readers = [asyncio.create_task(read(s)) for s in opened]
    windows = audio.shape[0] // CHUNK
    t0 = time.thread_time()
    for k in range(ticks):
        need = (k + 1) * sessions
        all_in.clear()
        for i, s in enumerate(opened):
            j = (i * 37 + k) % windows
            s.send("audio", audio[j * CHUNK : (j + 1) * CHUNK], ts_ms=k * 32.0)
        await all_in.wait()
    cpu = time.thread_time() - t0
    await asyncio.gather(*(s.close() for s in opened))
    await asyncio.gather(*readers)
    return cpu * 1e6 / (sessions * ticks)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    audio = speech()
    limits = SessionLimits(max_sessions=4096, max_chunks_per_s=1e6, burst=10**6)
    results: dict[str, list[float]] = {"run_chunk": [], "infer": []}
    async with Executor(load_graph(GRAPH).without_cache(), timeout_s=120) as executor:
        async with SessionManager(executor, limits) as warm:  # load, first batches, caches
            await closed_loop(warm, audio, args.sessions, 10)
        for r in range(args.rounds):
            for path in results:
                kind = SessionManager if path == "run_chunk" else RequestPathSessions
                async with kind(executor, limits) as manager:
                    us = await closed_loop(manager, audio, args.sessions, args.ticks)
                results[path].append(us)
                print(f"round {r + 1}  {path:9s}  {us:6.1f} us of event-loop CPU per chunk", flush=True)
    lean, request = (statistics.median(v) for v in results.values())
    print(
        f"\n{args.sessions} sessions x {args.ticks} chunks, median of {args.rounds} rounds: run_chunk {lean:.1f} us, "
        f"infer {request:.1f} us per chunk; infer / run_chunk {request / lean:.2f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
