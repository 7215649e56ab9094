"""Embedded vs Ray Serve engine: the same graph behind `usg serve`, the same client load.

Starts `usg serve GRAPH` (embedded) and `usg serve GRAPH --engine ray` (a local Ray on this
machine) one after the other on a free 127.0.0.1 port, runs `usg bench URL` against each
(closed loop, the same clients and duration), alternating the order over rounds, and prints
requests/s, p50/p95, the CPU time the server's process tree (Ray's processes included) spent per
request, and the ratios ray / embedded per round. On one machine the Ray engine
pays a process hop per model call; this measures what that costs before you need it.

Run: python benchmarks/engines.py [--concurrency 8] [--duration 20] [--rounds 2] [--graph PATH]

A/B of server variants in the same run (each variant's processes alternate with the others' in
every round, the order reversed each round):
  --tree NAME=SRC    a variant whose `usg serve` runs the usg package of SRC (its PYTHONPATH),
                     e.g. --tree main=/work/main/src --tree new=/work/wt-x/src
  --env NAME=K=V     an environment variable of variant NAME's server (a variant of its own if
                     no --tree names it), e.g. --env quiet=RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1
  --engine ray       measure one engine only (default: both, with the ratio ray / embedded)
  --idle 10          before the load, the CPU each process of the server burns per second with
                     no request at all (Ray's daemons, polling replicas)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _machine_cpu_s() -> float:
    """CPU seconds every process of the machine spent so far (user + system, all cores)."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


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
    if head.startswith("ray::"):
        # Ray sets a worker's title to its actor and the method it runs now:
        # ray::ServeReplica:app:deployment[.method], ray::ServeController[.listen_for_change]
        name = head.split()[0].split(".", 1)[0]  # deployment names have no "." (deployment_name)
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
    engine: str,
    graph: Path,
    concurrency: int,
    duration: float,
    warmup: float,
    port: int | None = None,
    *,
    env: dict[str, str] | None = None,
    idle_s: float = 0.0,
) -> dict[str, Any]:
    port = port or _free_port()
    log = Path(tempfile.gettempdir()) / f"usg-engines-{engine}-{port}.log"
    with log.open("wb") as fh:
        server = subprocess.Popen(
            # --no-cache: the samples repeat, a node cache would answer them
            [str(USG), "serve", str(graph), "--engine", engine, "--port", str(port), "--max-inflight=256", *NO_CACHE],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
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
        idle: dict[str, float] = {}
        if idle_s > 0:  # CPU per second of each process with no request in flight
            time.sleep(2.0)  # let the start-up settle
            before, t0 = _tree_cpu_by_role(server.pid), time.monotonic()
            time.sleep(idle_s)
            after, spent = _tree_cpu_by_role(server.pid), time.monotonic() - t0
            idle = {k: (v - before.get(k, 0.0)) * 1e3 / spent for k, v in after.items() if v > before.get(k, 0.0)}
        cpu0, served0, bytes0 = _tree_cpu_s(server.pid), _served(port), _remote_bytes(port)
        roles0 = _tree_cpu_by_role(server.pid)
        machine0, client0 = _machine_cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
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
        client1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the bench client (the only child that ended)
        client_s = client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime
        machine_s = _machine_cpu_s() - machine0
        # CPU of the server and every process it started (Ray's GCS, raylet, replicas) per request
        # it answered (warm-up included): what the engine costs, whatever else runs on the machine
        served = _served(port) - served0
        result["cpu_ms_per_request"] = (_tree_cpu_s(server.pid) - cpu0) * 1e3 / max(1, served)
        # where the rest of the machine's CPU went meanwhile: the load generator, everything else
        result["client_cpu_ms_per_request"] = client_s * 1e3 / max(1, served)
        result["machine_cpu_ms_per_request"] = machine_s * 1e3 / max(1, served)
        roles = _tree_cpu_by_role(server.pid)
        result["cpu_ms_by_role"] = {
            k: (v - roles0.get(k, 0.0)) * 1e3 / max(1, served) for k, v in roles.items() if v > roles0.get(k, 0.0)
        }
        result["idle_cpu_ms_per_s_by_role"] = idle
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


def _variants(trees: list[str], envs: list[str]) -> dict[str, dict[str, str]]:
    """Variant name -> the environment its servers get (PYTHONPATH from --tree, --env pairs)."""
    out: dict[str, dict[str, str]] = {}
    for spec in trees:
        name, sep, src = spec.partition("=")
        if not sep or not name or not src:
            raise SystemExit(f"--tree {spec!r}: expected NAME=SRC, e.g. --tree main=/work/main/src")
        out.setdefault(name, {})["PYTHONPATH"] = str(Path(src).resolve())
    for spec in envs:
        name, sep, pair = spec.partition("=")
        key, sep2, value = pair.partition("=")
        if not sep or not sep2 or not name or not key:
            raise SystemExit(
                f"--env {spec!r}: expected NAME=KEY=VALUE, e.g. --env slow=RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1"
            )
        out.setdefault(name, {})[key] = value
    return out or {"": {}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", type=Path, default=ROOT / "examples" / "document_ocr" / "graph.yaml")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cache-flag", choices=["on", "off"], default="on")
    ap.add_argument("--port", type=int, default=None, help="the servers' HTTP port (default: a free one)")
    ap.add_argument("--engine", choices=["both", "embedded", "ray"], default="both")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=SRC", help="a variant's usg source tree")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=KEY=VALUE", help="a variant's env variable")
    ap.add_argument("--idle", type=float, default=0.0, metavar="S", help="measure CPU per second with no load first")
    args = ap.parse_args()
    if args.no_cache_flag == "off":
        NO_CACHE.clear()
    os.environ.setdefault("USG_CACHE", str(Path.home() / ".cache" / "usg"))
    variants = _variants(args.tree, args.env)
    for name, env in variants.items():
        if name:
            print(f"variant {name}: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(as is)"))
    engines = ["embedded", "ray"] if args.engine == "both" else [args.engine]
    runs = [(v, e) for v in variants for e in engines]
    print(
        f"{'round':>5} {'variant':>10} {'engine':>9} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8} {'errors':>6} "
        f"{'CPU ms/req':>10} {'MB/req store':>12} {'MB/req gRPC':>11}"
    )
    ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    first = runs[0]
    for r in range(1, args.rounds + 1):
        order = runs if r % 2 else runs[::-1]
        got: dict[tuple[str, str], dict[str, Any]] = {}
        for variant, engine in order:
            res = _measure(
                engine,
                args.graph,
                args.concurrency,
                args.duration,
                args.warmup,
                args.port,
                env=variants[variant],
                idle_s=args.idle,
            )
            got[(variant, engine)] = res
            res = {k: (float("nan") if v is None else v) for k, v in res.items()}  # nothing completed
            print(
                f"{r:>5} {variant or '-':>10} {engine:>9} {res['throughput_rps']:>7.2f} {res['p50_ms']:>8.0f} "
                f"{res['p95_ms']:>8.0f} {res['errors']:>6} {res['cpu_ms_per_request']:>10.0f} "
                f"{res['object_store_mb_per_request']:>12.2f} {res['grpc_mb_per_request']:>11.2f}",
                flush=True,
            )
        for (variant, engine), res in got.items():
            label = f"{variant} {engine}".strip()
            if res["idle_cpu_ms_per_s_by_role"]:
                idle = sorted(res["idle_cpu_ms_per_s_by_role"].items(), key=lambda kv: -kv[1])
                total = sum(v for _, v in idle)
                print(
                    f"      {label} idle CPU ms/s by process (total {total:.0f}): "
                    + ", ".join(f"{k} {v:.1f}" for k, v in idle)
                )
            by_role = sorted(res["cpu_ms_by_role"].items(), key=lambda kv: -kv[1])
            print(f"      {label} CPU ms/request by process: " + ", ".join(f"{k} {v:.0f}" for k, v in by_role))
            other = res["machine_cpu_ms_per_request"] - res["cpu_ms_per_request"] - res["client_cpu_ms_per_request"]
            print(
                f"      {label} CPU ms/request elsewhere: load generator {res['client_cpu_ms_per_request']:.0f}, "
                f"other processes of the machine {other:.0f}"
            )

        pairs: list[tuple[str, tuple[str, str], tuple[str, str]]] = []
        if len(engines) == 2:  # ray / embedded within each variant
            pairs += [(f"{v + ': ' if v else ''}ray / embedded", (v, "ray"), (v, "embedded")) for v in variants]
        pairs += [(f"{v} / {first[0]} ({e})", (v, e), (first[0], e)) for v, e in runs if v != first[0]]
        for label, a, b in pairs:
            ratio = float(got[a]["throughput_rps"] or 0.0) / max(1e-9, float(got[b]["throughput_rps"] or 0.0))
            cpu_ratio = float(got[b]["cpu_ms_per_request"]) / max(1e-9, float(got[a]["cpu_ms_per_request"]))
            ratios.setdefault(label, []).append(ratio)
            cpu_ratios.setdefault(label, []).append(cpu_ratio)
            print(f"{r:>5} {label} throughput = {ratio:.2f}x; CPU per request, inverse = {cpu_ratio:.2f}x")
    for label, values in ratios.items():
        print(
            f"median {label} over {len(values)} round(s): throughput {statistics.median(values):.2f}x "
            f"({', '.join(f'{v:.2f}' for v in values)}); CPU per request {statistics.median(cpu_ratios[label]):.2f}x"
        )


if __name__ == "__main__":
    main()
