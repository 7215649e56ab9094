"""The node cache on the document-OCR example: throughput with the cache on vs off, hit latency
in memory and from Redis, hashing overhead on a miss. Prints measured figures (same run).

16 clients send PNG documents, half of them repeats of a document sent before; the outputs of
the cached run must equal the uncached run's, request by request.

Run: python benchmarks/cache.py [--requests 64] [--clients 16] [--repeat-rate 0.5]
     python benchmarks/cache.py --hits-only [--rounds 4]   (memory-hit latency: decode skipped vs not)
(the Redis figures need redis-server on PATH; it is started on a free 127.0.0.1 port)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from usg.cache import digest_inputs
from usg.cache.key import node_keys
from usg.graph import load_graph
from usg.runtime import Executor
from usg.runtime.observer import Observer
from usg.testing.documents import Line, render_document

GRAPH = Path(__file__).resolve().parents[1] / "examples" / "document_ocr" / "graph.yaml"


def png_of(lines: list[Line]) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(render_document(lines)).save(buf, format="PNG")
    return buf.getvalue()


def documents(n: int) -> list[bytes]:
    return [
        png_of([Line(f"Invoice {10000 + i} total {i * 7 + 3} EUR", size=28), Line(f"Order {i:04d}-AX", size=24)])
        for i in range(n)
    ]


def workload(n: int, repeat_rate: float, seed: int = 0) -> list[bytes]:
    """n requests in random order; a share ``repeat_rate`` of them repeats a document."""
    rng = random.Random(seed)
    docs = documents(max(1, round(n * (1 - repeat_rate))))
    reqs = docs + [rng.choice(docs) for _ in range(n - len(docs))]
    rng.shuffle(reqs)
    return reqs


async def drive(ex: Executor, reqs: list[bytes], clients: int) -> tuple[float, list[Any]]:
    results: list[Any] = [None] * len(reqs)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(reqs)):
        queue.put_nowait(i)

    async def client() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results[i] = await ex.infer({"image": reqs[i]}, timeout_s=600)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0, results


def compare(reqs: list[bytes], off: list[Any], on: list[Any]) -> str:
    """Lines equal request by request; embedding differences vs the uncached run (batch
    composition differs between runs); a cached answer bit-identical to the first answer
    for the same document in the cached run."""
    lines_equal = sum(a.outputs["lines"] == b.outputs["lines"] for a, b in zip(off, on, strict=True))
    diff = max(
        float(np.max(np.abs(a.outputs["ocr_embedding"] - b.outputs["ocr_embedding"])))
        for a, b in zip(off, on, strict=True)
        if "ocr_embedding" in a.outputs
    )
    first: dict[bytes, Any] = {}
    repeats_identical = True
    for doc, r in zip(reqs, on, strict=True):
        if doc in first:
            f = first[doc]
            same = f.outputs["lines"] == r.outputs["lines"]
            repeats_identical &= same and bool(np.array_equal(f.outputs["ocr_embedding"], r.outputs["ocr_embedding"]))
        else:
            first[doc] = r
    return (
        f"lines equal to the uncached run: {lines_equal}/{len(reqs)}; max |ocr_embedding diff| vs uncached "
        f"{diff:.2e}; repeats bit-identical to the first answer in the cached run: {repeats_identical}"
    )


async def hit_latency(ex: Executor, doc: bytes, n: int = 30) -> tuple[float, float]:
    """p50 of a full request on a repeated document, and p50 of the cache step of one node."""
    await ex.infer({"image": doc})
    assert ex.cache is not None
    ex.cache.stats["lines"].hit_ms.clear()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await ex.infer({"image": doc})
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), statistics.median(ex.cache.stats["lines"].hit_ms)


def redis_graph(tmp: Path, url: str) -> Path:
    text = GRAPH.read_text().replace(
        "cache: {backend: memory, max_bytes: 268435456}", f'cache: {{backend: redis, url: "{url}"}}'
    )
    path = tmp / "graph.yaml"
    path.write_text(text)
    return path


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    return None


class _ReadsInputs(Observer):
    """An observer of decoded inputs (as the monitor is): the executor then decodes every image
    before the cache lookup — the behaviour before hits were keyed on the received bytes."""

    def request_values(self, request_id: str, inputs: Any, nodes: Any) -> None:
        return None


async def hits_only(graph: Any, doc: bytes, rounds: int) -> None:
    """Memory-hit latency, decode skipped vs decoded before the lookup, alternating in one run."""
    async with Executor(graph) as skip, Executor(graph, observers=[_ReadsInputs()]) as decode:
        got: dict[str, list[float]] = {"skip": [], "decode": []}
        for r in range(rounds):
            for name, ex in (
                (("skip", skip), ("decode", decode)) if r % 2 == 0 else (("decode", decode), ("skip", skip))
            ):
                req_ms, _ = await hit_latency(ex, doc)
                got[name].append(req_ms)
    print(f"memory hit, request p50 per round (decode skipped): {', '.join(f'{v:.2f}' for v in got['skip'])} ms")
    print(f"memory hit, request p50 per round (image decoded first): {', '.join(f'{v:.2f}' for v in got['decode'])} ms")
    print(
        f"median: {statistics.median(got['skip']):.2f} ms decode skipped vs {statistics.median(got['decode']):.2f} ms"
    )


async def main(args: argparse.Namespace) -> None:
    graph = load_graph(GRAPH, export_missing=True)
    if args.hits_only:
        await hits_only(graph, documents(1)[0], args.rounds)
        return
    reqs = workload(args.requests, args.repeat_rate)
    print(f"{len(reqs)} requests, {len(set(reqs))} distinct documents, {args.clients} clients")
    async with Executor(graph, cache=False) as ex:
        await ex.infer({"image": reqs[0]})  # warm-up (sessions, threads)
        off_s, off = await drive(ex, reqs, args.clients)
        miss_ms = []
        for doc in reqs[:5]:
            t0 = time.perf_counter()
            await ex.infer({"image": doc})
            miss_ms.append((time.perf_counter() - t0) * 1e3)
    async with Executor(graph) as ex:
        await ex.infer({"image": png_of([Line("Warm-up page", size=30)])})  # a document not in the workload
        on_s, on = await drive(ex, reqs, args.clients)
        st = ex.cache.stats if ex.cache else {}
        hits = {n: (s.hits + s.coalesced, s.misses) for n, s in st.items()}
        mem_req_ms, mem_hit_ms = await hit_latency(ex, reqs[0])
        assert ex.cache is not None
        identities = ex.cache.identities
        active, _ = ex.plan({"image"})
    print(f"cache off: {len(reqs) / off_s:.2f} req/s ({off_s:.1f} s)")
    print(f"cache on:  {len(reqs) / on_s:.2f} req/s ({on_s:.1f} s)   ratio on/off: {off_s / on_s:.2f}x")
    print(compare(reqs, off, on))
    print(f"(hits + coalesced, misses) per node: {hits}")
    print(f"memory hit: request p50 {mem_req_ms:.2f} ms (image not decoded), lines cache step p50 {mem_hit_ms:.3f} ms")
    t0 = time.perf_counter()
    n = 50
    for _ in range(n):
        digests = digest_inputs(graph, {"image": reqs[0]})
        node_keys(graph, identities, digests, active)
    hash_ms = (time.perf_counter() - t0) / n * 1e3
    miss = statistics.median(miss_ms)
    print(f"hashing on a miss: {hash_ms:.3f} ms of a {miss:.0f} ms uncached request ({hash_ms / miss * 100:.3f} %)")
    with tempfile.TemporaryDirectory() as tmp:
        started = start_redis(Path(tmp))
        if started is None:
            print("redis: redis-server not found; skipped")
            return
        proc, url = started
        try:
            async with Executor(load_graph(redis_graph(Path(tmp), url))) as ex:
                req_ms, step_ms = await hit_latency(ex, reqs[0])
            print(f"redis hit: request p50 {req_ms:.2f} ms, lines cache step p50 {step_ms:.3f} ms")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat-rate", type=float, default=0.5)
    parser.add_argument(
        "--hits-only", action="store_true", help="only the memory-hit latency A/B (decode skipped or not)"
    )
    parser.add_argument("--rounds", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
