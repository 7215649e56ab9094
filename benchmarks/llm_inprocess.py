"""``usg serve``'s own CPU a plain LLM question, in process: the app called through ASGI (no HTTP
server, no client) on one uvloop loop, against a raw fake engine in another process that answers
every chat completion at once with the same whole completion.

Each call is timed with ``time.thread_time`` (this thread's CPU: the app, the executor, the
backend and its engine client, the engine round trip's syscalls; not the engine, not waiting).
Prints the median CPU per call of each block of ``--calls`` sequential questions, and their median.
Session 11's method (benchmarks/README.md, issue #15), kept to price a change to the prompt + LLM
path: run it for two trees alternately under the lock, e.g.
``PYTHONPATH=/tmp/main-src python benchmarks/llm_inprocess.py`` vs this tree's ``src``.

Run: ``python benchmarks/llm_inprocess.py [--blocks 5] [--calls 600]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llm_overhead import GRAPH  # the same graph as the end-to-end benchmark

ANSWER = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "forty two"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
    }
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "max_model_len": 4096}]}).encode()


class _Engine(asyncio.Protocol):
    """Keep-alive HTTP/1.1: one answer per request (``GET /v1/models`` or any POST)."""

    def connection_made(self, transport: Any) -> None:
        self.t, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            body = MODELS if head.startswith("GET /v1/models") else ANSWER
            self.t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )


def _serve_engine(port: int) -> None:
    import uvloop

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(_Engine, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(run())


async def _measure(url: str, blocks: int, calls: int) -> list[float]:
    import usg
    from usg.runtime.heap import freeze_startup_heap
    from usg.serve.app import create_app

    path = Path(tempfile.mkdtemp(prefix="llm-inprocess-")) / "graph.yaml"
    path.write_text(GRAPH.format(url=url, model="tiny", max_tokens=8, inflight=32))
    app = create_app(usg.load_graph(path), max_inflight=64)
    lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    life = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan_in.get, lifespan_out.put)
    )
    await lifespan_in.put({"type": "lifespan.startup"})
    started = await lifespan_out.get()
    assert started["type"] == "lifespan.startup.complete", started
    body = json.dumps({"inputs": {"question": "What is the total amount due on this invoice?"}}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/infer",
        "raw_path": b"/v1/infer",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(dict(scope, state={}), receive, send)
        if status != [200]:
            raise SystemExit(f"the app answered {status}, expected 200")

    for _ in range(200):  # warm: connections, caches, first-call paths
        await one()
    freeze_startup_heap()
    medians = []
    for _ in range(blocks):
        per_call = []
        for _ in range(calls):
            t0 = time.thread_time()
            await one()
            per_call.append(time.thread_time() - t0)
        medians.append(statistics.median(per_call) * 1e6)
    await lifespan_in.put({"type": "lifespan.shutdown"})
    await lifespan_out.get()
    await life
    return medians


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--engine-port", type=int, default=None, help=argparse.SUPPRESS)  # the engine process
    args = ap.parse_args()
    if args.engine_port:
        _serve_engine(args.engine_port)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = subprocess.Popen([sys.executable, __file__, "--engine-port", str(port)])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        import uvloop

        medians = uvloop.run(_measure(f"http://127.0.0.1:{port}", args.blocks, args.calls))
    finally:
        engine.terminate()
        engine.wait(10)
    import usg

    print(f"usg from {Path(usg.__file__).parent}")
    print(f"CPU per question, median of each block of {args.calls} (µs): " + " ".join(f"{m:.1f}" for m in medians))
    print(f"median of the blocks: {statistics.median(medians):.1f} µs (pid {os.getpid()})")


if __name__ == "__main__":
    main()
