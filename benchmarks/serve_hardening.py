"""What the serve hardening (issue #14) costs and what it buys, measured in one run.

overhead   ``usg bench URL`` of the document graph against two ``usg serve`` processes started
           back to back in rounds, one from ``--baseline-src`` (e.g. a checkout of main) and one
           from this tree: HTTP p50 (target: the hardened server adds <= 5%).
layer      the HTTP layer alone, in process (httpx ASGITransport, no sockets), on a model-free
           graph (tests/resources/serve/slow.yaml, one Python node): median latency of sequential
           /v1 requests, both trees in alternating child processes. Model compute is left out,
           so what differs is admission, decoding and error handling.
slowloris  the hardened server with ``--max-inflight 8``: p50 of text requests from 4 clients,
           alone and while 50 connections stall (headers sent, 10 of 100000 body bytes, then
           nothing; each reconnects when the server closes it). Target: within 2x of normal.

Run:  python benchmarks/serve_hardening.py overhead --baseline-src /work/main/src [--rounds 2] [--inputs DIR]
      python benchmarks/serve_hardening.py layer --baseline-src /work/main/src [--rounds 5 --requests 600]
      python benchmarks/serve_hardening.py slowloris [--sockets 50 --duration 10] [--src /work/main/src]
Prints figures and ratios; no pass/fail (machines here are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"
USG = Path(sys.executable).parent / "usg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, src: Path, *args: str) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.log = Path(tempfile.mkdtemp(prefix="usg-bench-")) / "serve.log"
        cmd = [str(USG), "serve", str(GRAPH), "--port", str(self.port), "--log-level", "warning", *args]
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"usg serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("usg serve not ready after 120 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _find(doc: Any, key: str) -> list[Any]:
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k == key] + [x for v in doc.values() for x in _find(v, key)]
    if isinstance(doc, list):
        return [x for v in doc for x in _find(v, key)]
    return []


def bench_p50(url: str, args: argparse.Namespace) -> tuple[float, float]:
    out = subprocess.run(
        [
            *(str(USG), "bench", url, "--graph", str(GRAPH), "-c", str(args.concurrency)),
            *("--duration", str(args.duration), "--warmup", str(args.warmup), "--json"),
            *(("--inputs", args.inputs) if args.inputs else ()),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    doc = json.loads(out.stdout)
    p50 = next((p for p in _find(doc, "p50_ms") if p is not None), None)  # None: nothing completed
    rps = _find(doc, "throughput_rps")
    return (float("nan") if p50 is None else float(p50)), (float(rps[0]) if rps else float("nan"))


def overhead(args: argparse.Namespace) -> None:
    systems = {"baseline": Path(args.baseline_src), "hardened": ROOT / "src"}
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in systems}
    for r in range(args.rounds):
        order = list(systems) if r % 2 == 0 else list(reversed(systems))
        for name in order:
            server = Server(systems[name])
            try:
                results[name].append(bench_p50(server.url, args))
            finally:
                server.stop()
            print(f"round {r + 1} {name:9s} p50 {results[name][-1][0]:8.1f} ms  ({results[name][-1][1]:.2f} req/s)")
    base = float(np.nanmedian([p for p, _ in results["baseline"]]))
    hard = float(np.nanmedian([p for p, _ in results["hardened"]]))
    print(f"\nmedian p50: baseline {base:.1f} ms, hardened {hard:.1f} ms, ratio {hard / base:.3f} (target <= 1.05)")


_LAYER_CHILD = """
import asyncio, statistics, sys, time
import httpx
from usg.graph import load_graph
from usg.serve import create_app

async def main(n):
    graph = load_graph(sys.argv[1])
    app = create_app(graph)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            lat = []
            for i in range(n):
                t0 = time.perf_counter()
                r = await c.post("/v1/infer", json={"inputs": {"text": f"query {i}"}})
                assert r.status_code == 200, r.text
                lat.append(time.perf_counter() - t0)
    print(statistics.median(lat[n // 10:]) * 1000)

asyncio.run(main(int(sys.argv[2])))
"""


def layer(args: argparse.Namespace) -> None:
    graph = ROOT / "tests" / "resources" / "serve" / "slow.yaml"
    trees = {"baseline": Path(args.baseline_src), "hardened": ROOT / "src"}
    medians: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            path = os.pathsep.join([str(trees[name]), str(graph.parent)])
            out = subprocess.run(
                [sys.executable, "-c", _LAYER_CHILD, str(graph), str(args.requests)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": path},
            )
            medians[name].append(float(out.stdout.split()[-1]))
            print(f"round {r + 1} {name:9s} median {medians[name][-1]:6.2f} ms per request")
    base, hard = float(np.median(medians["baseline"])), float(np.median(medians["hardened"]))
    print(f"\nmedian of medians: baseline {base:.2f} ms, hardened {hard:.2f} ms, ratio {hard / base:.3f}")


def _stall_forever(port: int, stop: threading.Event, sockets: int, reconnects: list[int]) -> None:
    """Keep ``sockets`` connections stalled mid-body; reopen each one the server closes."""
    head = (
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"inputs":'
    )

    def one() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(head)
        s.setblocking(False)
        return s

    open_ = [one() for _ in range(sockets)]
    while not stop.is_set():
        for i, s in enumerate(open_):
            try:
                if s.recv(65536) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                continue
            except OSError:
                s.close()
                open_[i] = one()
                reconnects[0] += 1
        stop.wait(0.05)
    for s in open_:
        s.close()


async def _text_p50(url: str, clients: int, duration: float) -> tuple[float, int, int]:
    import httpx

    lat: list[float] = []
    bad = 0
    stop_at = time.perf_counter() + duration
    async with httpx.AsyncClient(timeout=30) as c:

        async def client(k: int) -> None:
            nonlocal bad
            i = 0
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                r = await c.post(f"{url}/v1/infer", json={"inputs": {"text": f"query {k} {i}"}})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    bad += 1
                i += 1

        await asyncio.gather(*(client(k) for k in range(clients)))
    return float(np.percentile(lat, 50) * 1000) if lat else float("nan"), len(lat), bad


def slowloris(args: argparse.Namespace) -> None:
    server = Server(Path(args.src) if args.src else ROOT / "src", "--max-inflight", "8")
    try:
        asyncio.run(_text_p50(server.url, 4, 3.0))  # warm-up
        normal, n_ok, n_bad = asyncio.run(_text_p50(server.url, 4, args.duration))
        print(f"normal:          p50 {normal:7.1f} ms  ({n_ok} answered, {n_bad} refused)")
        stop, reconnects = threading.Event(), [0]
        attacker = threading.Thread(target=_stall_forever, args=(server.port, stop, args.sockets, reconnects))
        attacker.start()
        time.sleep(1.0)
        try:
            attacked, a_ok, a_bad = asyncio.run(_text_p50(server.url, 4, args.duration))
        finally:
            stop.set()
            attacker.join()
        print(
            f"{args.sockets} stalled sockets: p50 {attacked:7.1f} ms  ({a_ok} answered, {a_bad} refused; "
            f"the server closed {reconnects[0]} stalled sockets, each reopened)"
        )
        print(f"ratio attacked / normal p50: {attacked / normal:.2f} (target <= 2)")
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--baseline-src", required=True, help="the src/ folder of the tree to compare against")
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--concurrency", type=int, default=4)
    o.add_argument("--duration", type=float, default=15.0)
    o.add_argument("--warmup", type=float, default=4.0)
    o.add_argument("--inputs", default=None, help="usg bench --inputs (e.g. a folder of .txt files: text-only)")
    la = sub.add_parser("layer")
    la.add_argument("--baseline-src", required=True)
    la.add_argument("--rounds", type=int, default=5)
    la.add_argument("--requests", type=int, default=600)
    s = sub.add_parser("slowloris")
    s.add_argument("--sockets", type=int, default=50)
    s.add_argument("--duration", type=float, default=10.0)
    s.add_argument("--src", default=None, help="the src/ folder of the server to attack (default: this tree)")
    args = ap.parse_args()
    {"overhead": overhead, "layer": layer, "slowloris": slowloris}[args.what](args)


if __name__ == "__main__":
    main()
