"""Embedded vs Ray Serve engine: the same graph behind `usg serve`, the same client load.

Starts `usg serve GRAPH` (embedded) and `usg serve GRAPH --engine ray` (a local Ray on this
machine) one after the other on a free 127.0.0.1 port, runs `usg bench URL` against each
(closed loop, the same clients and duration), alternating the order over rounds, and prints
requests/s, p50/p95, the CPU time the server's process tree (Ray's processes included) spent per
request, and the ratios ray / embedded per round. On one machine the Ray engine
pays a process hop per model call; this measures what that costs before you need it.

Run: python benchmarks/engines.py [--concurrency 8] [--duration 20] [--rounds 2] [--graph PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
USG = Path(sys.executable).parent / "usg"
NO_CACHE = ["--no-cache"]  # --no-cache-flag off: for a USG whose Ray engine lacks it (use a graph without cache:)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_cpu_s(pid: int) -> float:
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # exited meanwhile
            pass
    return total


def _role(cmdline: list[str]) -> str:
    """What a process of the server's tree is: a replica (by deployment), a Ray daemon, the server."""
    head = cmdline[0] if cmdline else "?"
    if head.startswith("ray::"):  # Ray sets a worker's title: ray::ServeReplica:app:deployment
        name = head.split()[0]
        return "replica " + name.rsplit(":", 1)[-1] if name.startswith("ray::ServeReplica") else name
    joined = " ".join(cmdline)
    for daemon in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env", "ray.util.client", "monitor.py"):
        if daemon in joined:
            return daemon
    if " serve " in f" {joined} ":
        return "usg serve (router / executor)"
    return Path(head).name


def _tree_cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds of the server's process tree so far, by :func:`_role`."""
    import psutil

    out: dict[str, float] = {}
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            role = _role(p.cmdline())
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def _served(port: int) -> float:
    """Requests the server answered so far (its /metrics request counter)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("usg_request_seconds_count")
    )


def _remote_bytes(port: int) -> dict[str, float]:
    """Bytes the router sent to and received from replicas so far, by transport (Ray engine only)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("usg_remote_bytes_total{"):
            transport = line.split('transport="', 1)[1].split('"', 1)[0]
            out[transport] = out.get(transport, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _measure(
    engine: str, graph: Path, concurrency: int, duration: float, warmup: float, port: int | None = None
) -> dict[str, Any]:
    port = port or _free_port()
    log = Path(tempfile.gettempdir()) / f"usg-engines-{engine}-{port}.log"
    with log.open("wb") as fh:
        server = subprocess.Popen(
            # --no-cache: the samples repeat, a node cache would answer them
            [str(USG), "serve", str(graph), "--engine", engine, "--port", str(port), "--max-inflight=256", *NO_CACHE],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{engine} server did not become ready; see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        cpu0, served0, bytes0 = _tree_cpu_s(server.pid), _served(port), _remote_bytes(port)
        roles0 = _tree_cpu_by_role(server.pid)
        out = subprocess.run(
            [
                str(USG),
                "bench",
                f"http://127.0.0.1:{port}",
                "--graph",
                str(graph),
                "-c",
                str(concurrency),
                "--duration",
                str(duration),
                "--warmup",
                str(warmup),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, Any] = json.loads(out.stdout)["results"][0]
        # CPU of the server and every process it started (Ray's GCS, raylet, replicas) per request
        # it answered (warm-up included): what the engine costs, whatever else runs on the machine
        served = _served(port) - served0
        result["cpu_ms_per_request"] = (_tree_cpu_s(server.pid) - cpu0) * 1e3 / max(1, served)
        roles = _tree_cpu_by_role(server.pid)
        result["cpu_ms_by_role"] = {
            k: (v - roles0.get(k, 0.0)) * 1e3 / max(1, served) for k, v in roles.items() if v > roles0.get(k, 0.0)
        }
        moved = _remote_bytes(port)
        for via in ("object_store", "grpc"):
            result[f"{via}_mb_per_request"] = (moved.get(via, 0.0) - bytes0.get(via, 0.0)) / 1e6 / max(1, served)
        return result
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", type=Path, default=ROOT / "examples" / "document_ocr" / "graph.yaml")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cache-flag", choices=["on", "off"], default="on")
    ap.add_argument("--port", type=int, default=None, help="the servers' HTTP port (default: a free one)")
    args = ap.parse_args()
    if args.no_cache_flag == "off":
        NO_CACHE.clear()
    os.environ.setdefault("USG_CACHE", str(Path.home() / ".cache" / "usg"))
    print(
        f"{'round':>5} {'engine':>9} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8} {'errors':>6} {'CPU ms/req':>10} "
        f"{'MB/req store':>12} {'MB/req gRPC':>11}"
    )
    ratios, cpu_ratios = [], []
    for r in range(1, args.rounds + 1):
        order = ["embedded", "ray"] if r % 2 else ["ray", "embedded"]
        got = {}
        for engine in order:
            res = _measure(engine, args.graph, args.concurrency, args.duration, args.warmup, args.port)
            got[engine] = res
            res = {k: (float("nan") if v is None else v) for k, v in res.items()}  # nothing completed
            print(
                f"{r:>5} {engine:>9} {res['throughput_rps']:>7.2f} {res['p50_ms']:>8.0f} {res['p95_ms']:>8.0f} "
                f"{res['errors']:>6} {res['cpu_ms_per_request']:>10.0f} "
                f"{res['object_store_mb_per_request']:>12.2f} {res['grpc_mb_per_request']:>11.2f}"
            )
        for engine, res in got.items():
            by_role = sorted(res["cpu_ms_by_role"].items(), key=lambda kv: -kv[1])
            print(f"      {engine} CPU ms/request by process: " + ", ".join(f"{k} {v:.0f}" for k, v in by_role))
        ratio = got["ray"]["throughput_rps"] / max(1e-9, got["embedded"]["throughput_rps"])
        ratios.append(ratio)
        cpu = got["embedded"]["cpu_ms_per_request"] / max(1e-9, got["ray"]["cpu_ms_per_request"])
        cpu_ratios.append(cpu)
        print(f"{r:>5} ray / embedded throughput = {ratio:.2f}x; embedded / ray CPU per request = {cpu:.2f}x")
    ratios.sort()
    print(f"median ray / embedded over {len(ratios)} round(s): {statistics.median(ratios):.2f}x")
    print(f"median embedded / ray CPU per request: {statistics.median(cpu_ratios):.2f}x")


if __name__ == "__main__":
    main()
