"""gRPC ModelInfer vs HTTP JSON /v1/infer on the text-only path of the document graph, same server.

Starts one `usg serve examples/document_ocr/graph.yaml --grpc-port G` on free 127.0.0.1 ports
(or uses a running one: --url and --grpc), checks that both protocols return the same
text embedding for every query text (max abs difference <= 1e-5), then runs the same closed
loop (N clients, each sending its next text as soon as its previous one returned) over
tritonclient.grpc.aio (one channel, BYTES text in, FP32 out) and over httpx (JSON in, JSON
out), alternating the order over rounds. Prints requests/s and p50/p95 per protocol and
round, the CPU time per request of the server process and of the client (this process) over
the measured window, and the ratio gRPC / HTTP (median over rounds). Clients and server
share this machine, so client CPU is taken from the server.

Run: python benchmarks/grpc_vs_http.py [--clients 32] [--duration 15] [--warmup 3] [--rounds 2] [--cpu-slots N]
(--cpu-slots is passed to the server it starts: 0 turns the executor's CPU gate off)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc.aio as tga
from tritonclient.grpc import InferInput, InferRequestedOutput

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"
USG = Path(sys.executable).parent / "usg"
MODEL = "document-ocr"
TEXTS = [
    "invoice total due",
    "where is my parcel with tracking code QX93020",
    "refund policy for damaged goods shipped abroad within the european union",
    "hi",
    "quarterly revenue grew by twelve percent while operating costs stayed flat " * 2,
    "contact support",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(max_inflight: int, cpu_slots: int | None = None) -> tuple[subprocess.Popen[bytes], str, str, Path]:
    port, grpc_port = _free_port(), _free_port()
    log = Path(tempfile.mkdtemp(prefix="grpc-bench-")) / "serve.log"
    with log.open("wb") as fh:
        args = ["--port", str(port), "--grpc-port", str(grpc_port), "--max-inflight", str(max_inflight)]
        if cpu_slots is not None:
            args += ["--cpu-slots", str(cpu_slots)]
        proc = subprocess.Popen(
            [str(USG), "serve", str(GRAPH), *args, "--log-level", "warning"],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"usg serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return proc, url, f"127.0.0.1:{grpc_port}", log
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"usg serve not ready after 180 s:\n{log.read_text()[-3000:]}")


def grpc_request(text: str) -> tuple[list[InferInput], list[InferRequestedOutput]]:
    t = InferInput("text", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [t], [InferRequestedOutput("text_embedding")]


async def grpc_embedding(client: tga.InferenceServerClient, text: str) -> np.ndarray[Any, Any]:
    inputs, outputs = grpc_request(text)
    result = await client.infer(MODEL, inputs, outputs=outputs)
    emb = result.as_numpy("text_embedding")
    assert emb is not None and emb.shape == (1, 384), "gRPC: no text_embedding [1, 384]"
    return emb


async def http_embedding(client: httpx.AsyncClient, url: str, text: str) -> np.ndarray[Any, Any]:
    r = await client.post(f"{url}/v1/infer", json={"inputs": {"text": text}})
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:300]}"
    emb = np.asarray(r.json()["outputs"]["text_embedding"], dtype=np.float32)
    assert emb.shape == (1, 384), "HTTP: no text_embedding [1, 384]"
    return emb


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (this one when ``pid`` is None)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(
    call: Callable[[str], Awaitable[object]], clients: int, duration: float, warmup: float, server_pid: int | None
) -> dict[str, float]:
    latencies: list[float] = []
    measure_from = time.perf_counter() + warmup
    stop_at = measure_from + duration
    cpu: dict[str, float] = {}

    async def meter() -> None:  # CPU of client and server over the measured window
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        cpu["client"] = -cpu_seconds(None)
        cpu["server"] = -cpu_seconds(server_pid) if server_pid else float("nan")
        await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
        cpu["client"] += cpu_seconds(None)
        cpu["server"] += cpu_seconds(server_pid) if server_pid else float("nan")

    async def client(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            await call(TEXTS[i % len(TEXTS)])
            t1 = time.perf_counter()
            if t0 >= measure_from and t1 <= stop_at:
                latencies.append((t1 - t0) * 1e3)
            i += clients

    await asyncio.gather(meter(), *(client(k) for k in range(clients)))
    n = max(1, len(latencies))
    return {
        "client_ms": cpu["client"] / n * 1e3,
        "server_ms": cpu["server"] / n * 1e3,
        "rps": len(latencies) / duration,
        "p50": float(np.percentile(latencies, 50)),
        "p95": float(np.percentile(latencies, 95)),
        "n": float(len(latencies)),
    }


async def run(args: argparse.Namespace, url: str, grpc_target: str, server_pid: int | None) -> None:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http, tga.InferenceServerClient(grpc_target) as grpc:
        worst = 0.0
        for text in TEXTS:  # same outputs on both protocols before any load
            a, b = await grpc_embedding(grpc, text), await http_embedding(http, url, text)
            worst = max(worst, float(np.max(np.abs(a - b))))
        if worst > 1e-5:
            raise SystemExit(f"gRPC and HTTP embeddings differ (max abs difference {worst:.2e}); no ratio")
        print(f"outputs checked: {len(TEXTS)} texts, max abs difference gRPC vs HTTP {worst:.1e}")

        calls: dict[str, Callable[[str], Awaitable[object]]] = {
            "grpc": lambda text: grpc_embedding(grpc, text),
            "http": lambda text: http_embedding(http, url, text),
        }
        ratios: list[float] = []
        print(f"{'round':>5} {'protocol':<22}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'n':>7}  CPU ms per request")
        for rnd in range(args.rounds):
            order = ["http", "grpc"] if rnd % 2 == 0 else ["grpc", "http"]
            got: dict[str, dict[str, float]] = {}
            for name in order:
                got[name] = r = await closed_loop(calls[name], args.clients, args.duration, args.warmup, server_pid)
                label = "gRPC ModelInfer" if name == "grpc" else "HTTP JSON /v1/infer"
                print(
                    f"{rnd + 1:>5} {label:<22}{r['rps']:>9.1f}{r['p50']:>9.1f}{r['p95']:>9.1f}{int(r['n']):>7}"
                    f"  server {r['server_ms']:.1f}, client {r['client_ms']:.1f}"
                )
            ratios.append(got["grpc"]["rps"] / got["http"]["rps"])
            print(f"{rnd + 1:>5} ratio gRPC / HTTP: {ratios[-1]:.2f}x")
    print(
        f"gRPC / HTTP requests/s at {args.clients} clients, median of {args.rounds} round(s): "
        f"{statistics.median(ratios):.2f}x (target >= 1.3x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=15.0, help="measured seconds per protocol and round")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--url", help="a running usg serve (HTTP), e.g. http://127.0.0.1:8000")
    ap.add_argument("--grpc", help="its --grpc-port address, e.g. 127.0.0.1:8001")
    ap.add_argument("--cpu-slots", type=int, default=None, help="usg serve --cpu-slots (0: the CPU gate off)")
    args = ap.parse_args()
    if bool(args.url) != bool(args.grpc):
        ap.error("give --url and --grpc together (or neither to start a server)")
    os.environ.setdefault("USG_CACHE", "/tmp/usgcache")
    proc = None
    if args.url:
        url, target = args.url.rstrip("/"), args.grpc
    else:
        proc, url, target, log = start_server(max_inflight=4 * args.clients, cpu_slots=args.cpu_slots)
        print(f"usg serve {GRAPH.relative_to(ROOT)} on {url} and gRPC {target} (log {log})")
    try:
        asyncio.run(run(args, url, target, proc.pid if proc is not None else None))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
