"""Streaming VAD: many real-time 16 kHz streams, USG sessions (VAD batched across streams) vs
silero's own per-stream loop (``silero_vad.VADIterator`` on ``OnnxWrapper``, same ONNX Runtime
and ONNX file). Prints measured figures (same run); no pass/fail.

Each stream sends 32 ms chunks (512 samples, PCM) of espeak-ng speech at real-time pace (stream
``i`` starts at a random phase within one chunk). Latency of a chunk = when its result came out
minus when the chunk was due (its capture time). USG: ``examples/speech_stream/graph.yaml`` in
the in-process executor, one :class:`usg.stream.Session` per stream (the silero node is a stateful
model, ``batch.max_size`` 64). Baseline: per stream its own ``VADIterator`` (all sharing one
``OnnxWrapper`` session, each with its own state), each chunk run on a 2-thread pool (2 cores),
a stream's chunks one after the other — silero's documented streaming loop, served as a server
would. For each system the stream count is stepped up (--streams; the two systems alternate at each
count, so both see the load of the moment), then the step between its last pass and its first
failure is halved until it is at most --resolution streams (again alternating). "Sustains" = the
most streams whose p95 chunk-to-event latency stays <= --p95-ms, with every smaller count tried
passing too. Each row also prints the event-loop thread's CPU per chunk (the one thread every
session's Python runs on). Then memory per idle session (tracemalloc) and 1,000 idle sessions open.

Both systems run in one process as ``usg serve`` runs sessions: on uvloop when it is installed
(``--loop asyncio``: the standard loop), with the heap built at start-up frozen out of the garbage
collector's full passes once the models are loaded (:mod:`usg.runtime.heap`; ``--no-freeze``: not).

``--systems usg,usg-ungated`` adds the same graph with the executor's CPU gate off
(``Executor(cpu_slots=0)``; ``usg`` runs the default gate), alternating with the others.

Run: python benchmarks/streaming.py [--seconds 6] [--p95-ms 100] [--streams 32,64,...] [--resolution 8] [--graph G]
     [--loop uvloop|asyncio] [--no-freeze] [--systems usg,silero,usg-ungated]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import subprocess
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import Overloaded
from usg.graph import load_graph
from usg.ops.audio import decode_audio
from usg.runtime import Executor
from usg.runtime.heap import freeze_startup_heap
from usg.stream import SessionLimits, SessionManager

GRAPH = Path(__file__).resolve().parents[1] / "examples" / "speech_stream" / "graph.yaml"
RATE, CHUNK = 16_000, 512
CHUNK_S = CHUNK / RATE


def speech() -> np.ndarray:
    """~9 s: espeak-ng phrases separated by silence, at 16 kHz."""
    parts = [np.zeros(RATE // 2, np.float32)]
    with tempfile.TemporaryDirectory() as d:
        for i, text in enumerate(["the quick brown fox jumps over the lazy dog", "seven hundred and forty two apples"]):
            wav = Path(d) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", str(wav), text], check=True)
            parts += [decode_audio(wav), np.zeros(RATE, np.float32)]
    x = np.concatenate(parts)
    return (np.round(x * 32767) / 32767).astype(np.float32)  # what a PCM16 client sends


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else float("nan")


async def _paced(n: int, seconds: float, audio: np.ndarray, handle: Any) -> list[float]:
    """Run ``n`` real-time streams for ``seconds``; ``handle(i, k, chunk, due)`` returns latency (s)."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(0)
    phases = rng.uniform(0, CHUNK_S, n)
    offsets = rng.integers(0, audio.shape[0] // CHUNK, n)
    n_chunks = int(seconds / CHUNK_S)
    t0 = loop.time() + 0.2
    lat: list[float] = []

    async def stream(i: int) -> None:
        for k in range(n_chunks):
            due = t0 + phases[i] + k * CHUNK_S
            await asyncio.sleep(max(0.0, due - loop.time()))
            j = (int(offsets[i]) + k) % (audio.shape[0] // CHUNK)
            await handle(i, k, audio[j * CHUNK : (j + 1) * CHUNK], due, lat)

    await asyncio.gather(*(stream(i) for i in range(n)))
    warm = int(1.0 / CHUNK_S) * n  # drop the first second of each run (approximately)
    return lat[warm:] if len(lat) > 2 * warm else lat


async def run_usg(n: int, seconds: float, audio: np.ndarray, executor: Executor) -> dict[str, float]:
    limits = SessionLimits(max_sessions=max(4096, n), max_chunks_per_s=1000, burst=1000)
    loop = asyncio.get_running_loop()
    async with SessionManager(executor, limits) as manager:
        sessions = [manager.open() for _ in range(n)]
        due_of: list[dict[int, float]] = [{} for _ in range(n)]
        lat: list[float] = []

        async def reader(i: int) -> None:
            async for event in sessions[i].events():
                if event["type"] == "error":
                    raise RuntimeError(event)
                if event["type"] != "result":
                    continue
                now = loop.time()
                for seq in range(event.get("first_seq", event["seq"]), event["seq"] + 1):
                    due = due_of[i].pop(seq, None)  # None: the flush run at close
                    if due is not None:
                        lat.append(now - due)

        readers = [asyncio.create_task(reader(i)) for i in range(n)]

        dropped = 0

        async def handle(i: int, k: int, chunk: np.ndarray, due: float, _: list[float]) -> None:
            nonlocal dropped
            try:
                seq = sessions[i].send("audio", chunk, ts_ms=due * 1e3)
            except Overloaded:  # the session is max_pending_chunks behind: it does not keep up
                dropped += 1
                return
            due_of[i][seq] = due

        cpu0, loop0 = time.process_time(), time.thread_time()
        await _paced(n, seconds, audio, handle)
        await asyncio.gather(*(s.close() for s in sessions))
        await asyncio.gather(*readers)
        cpu = time.process_time() - cpu0  # until every chunk ran: the CPU the stream-seconds cost
        loop_cpu = time.thread_time() - loop0  # of these, the event loop's thread (this one)
    warm = int(1.0 / CHUNK_S) * n
    kept = lat[warm:] if len(lat) > 2 * warm else lat
    p95_ms = p95(kept) * 1e3 if not dropped else float("inf")
    return {
        "streams": n,
        "p95_ms": p95_ms,
        "p50_ms": float(np.median(kept)) * 1e3,
        "chunks": len(lat),
        "dropped": dropped,
        "cpu_ms_per_stream_s": cpu * 1e3 / (n * seconds),
        "loop_us_per_chunk": loop_cpu * 1e6 / max(1, len(lat) + dropped),
    }


async def run_silero(n: int, seconds: float, audio: np.ndarray, pool: ThreadPoolExecutor) -> dict[str, float]:
    import silero_vad
    import torch

    torch.set_num_threads(1)
    base = silero_vad.load_silero_vad(onnx=True)
    iterators = []
    for _ in range(n):
        model = copy.copy(base)  # the same ORT session, this stream's own state
        model.reset_states()
        iterators.append(silero_vad.VADIterator(model, sampling_rate=RATE))
    locks = [asyncio.Lock() for _ in range(n)]
    loop = asyncio.get_running_loop()

    async def handle(i: int, k: int, chunk: np.ndarray, due: float, lat: list[float]) -> None:
        async def one() -> None:
            async with locks[i]:  # a stream's chunks one after the other
                await loop.run_in_executor(pool, iterators[i], torch.from_numpy(chunk))
                lat.append(loop.time() - due)

        tasks.add(t := asyncio.create_task(one()))
        t.add_done_callback(tasks.discard)

    tasks: set[asyncio.Task[None]] = set()
    cpu0, loop0 = time.process_time(), time.thread_time()
    lat = await _paced(n, seconds, audio, handle)
    while tasks:
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu0
    loop_cpu = time.thread_time() - loop0
    chunks = n * int(seconds / CHUNK_S)
    return {
        "streams": n,
        "p95_ms": p95(lat) * 1e3,
        "p50_ms": float(np.median(lat)) * 1e3,
        "chunks": len(lat),
        "cpu_ms_per_stream_s": cpu * 1e3 / (n * seconds),
        "loop_us_per_chunk": loop_cpu * 1e6 / chunks,
    }


def sustained(rows: list[dict[str, float]], target_ms: float) -> int:
    """The most streams that kept p95 <= target, every smaller count tried keeping it too."""
    best = 0
    for r in sorted(rows, key=lambda r: r["streams"]):
        if r["p95_ms"] > target_ms:
            break
        best = int(r["streams"])
    return best


def next_probe(rows: list[dict[str, float]], target_ms: float, resolution: int) -> int | None:
    """A count halfway between a system's last pass and its first failure, while they are more
    than ``resolution`` apart (None: none to try)."""
    ok = sustained(rows, target_ms)
    above = [int(r["streams"]) for r in rows if r["streams"] > ok]
    if not above:
        return None
    fail = min(above)
    if fail - ok <= resolution:
        return None
    return (ok + fail) // 2


async def memory(executor: Executor, audio: np.ndarray, count: int) -> dict[str, float]:
    """tracemalloc bytes per idle session: opened and sent one chunk (state allocated), then idle."""
    limits = SessionLimits(max_sessions=count + 16, idle_timeout_s=3600)
    async with SessionManager(executor, limits) as manager:
        warm = manager.open()
        warm.send("audio", audio[:CHUNK], 0.0)
        await warm.next_event(30)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        sessions = [manager.open() for _ in range(count)]
        fresh = tracemalloc.take_snapshot()
        for s in sessions:
            s.send("audio", audio[:CHUNK], 0.0)
        for s in sessions:
            await s.next_event(60)
        await asyncio.sleep(0.05)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()

        def total(a: Any, b: Any) -> float:
            return sum(st.size_diff for st in a.compare_to(b, "filename"))

        out = {
            "sessions": count,
            "open_bytes_per_session": total(fresh, before) / count,
            "idle_bytes_per_session": total(after, before) / count,
            "open": len(manager.sessions),
        }
    return out


def _print(name: str, row: dict[str, float]) -> None:
    print(
        f"{name:11s} streams={int(row['streams']):4d}  p50={row['p50_ms']:7.1f} ms  p95={row['p95_ms']:7.1f} ms  "
        f"chunks={row['chunks']}  dropped (session behind) {row.get('dropped', 0)}  "
        f"CPU {row['cpu_ms_per_stream_s']:.1f} ms per stream-second  "
        f"loop thread {row['loop_us_per_chunk']:.0f} us per chunk",
        flush=True,
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--p95-ms", type=float, default=100.0)
    ap.add_argument("--streams", default="16,32,64,96,128,160,192,224,256,288,320,384,448,512")
    ap.add_argument("--resolution", type=int, default=8, help="refine each limit to within this many streams")
    ap.add_argument("--idle-sessions", type=int, default=1000)
    ap.add_argument("--graph", type=Path, default=GRAPH, help="the VAD graph the sessions run (default: the example)")
    ap.add_argument("--no-freeze", action="store_true", help="leave the start-up heap to the garbage collector")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default=None, help=LOOP_HELP)
    ap.add_argument(
        "--systems",
        default="usg,silero",
        help="systems to alternate: usg, silero, usg-ungated (usg with the CPU gate off: cpu_slots=0)",
    )
    args = ap.parse_args()
    systems = args.systems.split(",")
    if not systems or any(s not in ("usg", "silero", "usg-ungated") for s in systems) or "usg" not in systems:
        ap.error(f"--systems {args.systems}: use usg plus any of silero, usg-ungated")
    print(f"event loop: {type(asyncio.get_running_loop()).__module__}", flush=True)
    audio = speech()
    graph = load_graph(args.graph).without_cache()
    pool = ThreadPoolExecutor(2, thread_name_prefix="silero")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    ungated = Executor(graph, timeout_s=120, cpu_slots=0) if "usg-ungated" in systems else None
    async with Executor(graph, timeout_s=120) as executor, contextlib.AsyncExitStack() as stack:
        if ungated is not None:
            await stack.enter_async_context(ungated)
        if not args.no_freeze:
            # as `usg serve` does once its models are loaded (usg.runtime.heap); the baseline's
            # modules (torch, silero_vad: ~140,000 objects) are imported first, so neither system's
            # full collections walk the other's start-up heap
            import silero_vad  # noqa: F401
            import torch  # noqa: F401

            print(f"start-up heap frozen: {freeze_startup_heap()} objects", flush=True)

        async def run(name: str, n: int) -> None:
            if name == "usg":
                row = await run_usg(n, args.seconds, audio, executor)
            elif name == "usg-ungated":
                assert ungated is not None
                row = await run_usg(n, args.seconds, audio, ungated)
            else:
                row = await run_silero(n, args.seconds, audio, pool)
            rows[name].append(row)
            _print(name, row)

        # the two systems alternate, step by step, so both see the machine's load of the moment
        for n in (int(v) for v in args.streams.split(",")):
            for name in rows:
                done = rows[name]
                if done and done[-1]["p95_ms"] > 3 * args.p95_ms:
                    continue  # this system stopped keeping up
                await run(name, n)
            if all(done and done[-1]["p95_ms"] > 3 * args.p95_ms for done in rows.values()):
                break
        # then each limit to within --resolution streams, the systems still alternating
        while True:
            probes = {name: next_probe(done, args.p95_ms, args.resolution) for name, done in rows.items()}
            if all(p is None for p in probes.values()):
                break
            for name, probe in probes.items():
                if probe is not None:
                    await run(name, probe)
        mem = await memory(executor, audio, args.idle_sessions)
    pool.shutdown()
    usg_rows, silero_rows = rows["usg"], rows.get("silero", [])
    u, s = sustained(usg_rows, args.p95_ms), sustained(silero_rows, args.p95_ms)
    gate = executor.cpu_gate
    print(
        f"\nusg's CPU gate ({gate.slots} slots): {sum(gate.calls.values())} model calls, "
        f"{sum(gate.waited.values())} waited for a core ({sum(gate.wait_s.values()) * 1e3:.1f} ms in all)"
    )
    if "usg-ungated" in rows:
        off = rows["usg-ungated"]
        print(
            f"CPU gate: usg (on, the default) sustains {u} streams, usg-ungated (off) "
            f"{sustained(off, args.p95_ms)}; p95 ms on / off at each count both ran:"
        )
        for r in usg_rows:
            o = next((x for x in off if x["streams"] == r["streams"]), None)
            if o is not None:
                print(
                    f"  {int(r['streams']):4d} streams: p95 {r['p95_ms']:.1f} / {o['p95_ms']:.1f} ms, "
                    f"p50 {r['p50_ms']:.1f} / {o['p50_ms']:.1f} ms, CPU per stream-second "
                    f"{r['cpu_ms_per_stream_s']:.2f} / {o['cpu_ms_per_stream_s']:.2f} ms"
                )
    if not silero_rows:
        return
    at64 = next((r for r in usg_rows if r["streams"] == 64), None)
    print()
    if at64 is not None:
        print(f"64 streams, USG sessions: p95 chunk-to-event {at64['p95_ms']:.1f} ms (target <= {args.p95_ms:g})")
    print(
        f"streams sustained at p95 <= {args.p95_ms:g} ms (every smaller count tried passing too; limits "
        f"refined to within {args.resolution}): usg {u}, silero per-stream loop {s}, "
        f"ratio {u / s if s else float('inf'):.2f}x (target >= 3x)"
    )
    cu = min(r["cpu_ms_per_stream_s"] for r in usg_rows)
    cs = min(r["cpu_ms_per_stream_s"] for r in silero_rows)
    print(
        "CPU per stream-second of audio (process time until every chunk ran, lowest of the sweep): "
        f"usg {cu:.1f} ms, silero loop {cs:.1f} ms; "
        f"ratio {cs / cu:.2f}x; streams 2 cores could carry at that cost: usg {2000 / cu:.0f}, silero {2000 / cs:.0f}"
    )
    for n in sorted({64, 128, u}):
        row = next((r for r in usg_rows if r["streams"] == n), None)
        if row is not None:
            print(f"event-loop thread CPU per chunk, usg at {n} streams: {row['loop_us_per_chunk']:.0f} us")
    print(
        f"memory: {mem['open_bytes_per_session'] / 1024:.1f} KiB per opened session, "
        f"{mem['idle_bytes_per_session'] / 1024:.1f} KiB per idle session after one chunk "
        f"(target <= 64 KiB); {mem['open']} sessions open at once"
    )


LOOP_HELP = (
    "the event loop both systems run on (default: uvloop when installed, as `usg serve` runs its "
    "sessions: uvicorn picks uvloop; asyncio: the standard loop)"
)


def _loop_factory() -> Any:
    import sys

    choice = sys.argv[sys.argv.index("--loop") + 1] if "--loop" in sys.argv[:-1] else None
    if choice != "asyncio":
        try:
            import uvloop

            return uvloop.new_event_loop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("--loop uvloop: uvloop is not installed (pip install 'usg[serve]')") from None
    return None


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())
