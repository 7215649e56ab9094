"""USG's overhead in front of a generation engine, against calling the engine directly, same run.

Starts one ``transformers serve`` (a tiny random-weight Llama on CPU, built here) and one
``usg serve`` of a two-node graph (``usg.ops.llm:chat`` → ``backend: openai``) in front of it, then:

1. latency: text-only questions one at a time, alternating direct / USG (``POST /v1/infer``),
   the direct call being the very chat completion USG sends (``engine_stream`` auto: one whole
   completion for a caller that does not stream);
2. time to first token: the same alternation, streamed (``"stream": true``; the first ``token``
   event vs the engine's first content delta; USG streams from the engine);
3. throughput: ``--clients`` concurrent clients, each sending ``--per-client`` questions, direct
   then through USG (``max_inflight`` = clients, so USG holds nothing back); once as plain
   questions and once streamed (each side's clients read the tokens as they come); the plain
   rounds also run a bare proxy (``benchmarks/bare_llm_proxy.py``: uvicorn + USG's engine client,
   no graph) — the floor any process in front of the engine pays on this machine's two cores,
   which the engine's threads share.

Placements (``benchmarks/llm_placement.py``; ``--placement shared,shared1`` runs both, in that
order, each with its own engine and servers, and prints each table and a summary): ``shared`` (the
default) pins nothing, so the engine's torch threads (torch's choice: one per core), the proxies and
the clients share every core; ``shared1`` is the same with the engine at one torch thread
(``OMP_NUM_THREADS=1``); ``shared-passive`` keeps torch's threads but lets idle ones sleep at once
(``OMP_WAIT_POLICY=PASSIVE``); ``split`` pins the engine to ``--engine-cpus`` (torch threads =
those cores) and this process (the clients), ``usg serve`` and the bare proxy to the other cores —
the deployment where the engine runs on its own hardware (a GPU) and a proxy's CPU is not taken
from generation. The same placement holds for the direct, USG and bare sides of it; the
``Cpus_allowed_list`` of every thread of every process is read after the warm-up and after the
rounds and printed, and so are the engine's OpenMP variables (``/proc/PID/environ``; the run stops
if one is off); each core's busy share and each engine thread's share of a core over each side's
rounds are printed (split: the proxy core near 100% means the proxy side was the limit; the engine
threads show how many of them compute). The summary divides each placement's USG and bare rates
by its own direct rate and by the best direct rate of the run's placements: the engine
configuration a deployment would pick.

Prints p50s, USG's added milliseconds (targets: ≤ 3 ms p50 on latency and on time to first
token), the ``usg serve`` process's CPU time per question, and the throughput ratios (target
≥ 0.95×). Greedy decoding: both paths generate the
same tokens. Run: ``python benchmarks/llm_overhead.py [--placement shared,shared1,split]`` (needs
``usg[llm-engine]``, torch, Linux ``/proc``; ``split`` needs 2+ cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "resources"), str(ROOT / "tests" / "resources" / "serve")]

from harness import start_server  # noqa: E402
from llm_engine import build_tiny_llama, start_engine  # noqa: E402
from llm_placement import (  # noqa: E402
    PLACEMENTS,
    busy_threads,
    check_engine_env,
    check_pinning,
    core_ticks,
    cpu_list,
    cpu_s,
    engine_env,
    fmt_cpus,
    pin_threads,
    spawning_on,
    thread_cpu_s,
)
from procs import ServerProcess, free_port  # noqa: E402

from usg.ops.llm import chat  # noqa: E402

GRAPH = """
name: ask
inputs:
  question: {{modality: text}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', model: '{model}', max_tokens: {max_tokens}, max_inflight: {inflight}, timeout_s: 300}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question}}
    options: {{system: "Be brief.", user: "Question: {{question}}"}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs:
  answer: answer.text
"""

QUESTION = "What is the total amount due on this invoice?"


def _direct_body(model: str, max_tokens: int, question: str, stream: bool) -> dict[str, Any]:
    """The chat completion USG sends for ``question`` (streamed when its caller streams)."""
    messages = chat(system="Be brief.", user="Question: {question}", question=question)["messages"]
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if stream:
        body.update({"stream": True, "stream_options": {"include_usage": True}})
    return body


def _direct(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(total s, time to first content delta s) of one chat completion (streamed or whole: then
    the first content is the whole answer)."""
    t0 = time.perf_counter()
    first = None
    if not body.get("stream"):
        client.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
        end = time.perf_counter()
        return end - t0, end - t0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter()
    end = time.perf_counter()
    return end - t0, (first or end) - t0


def _usg(client: httpx.Client, url: str, question: str, stream: bool) -> tuple[float, float]:
    """(total s, time to the first token event s) of one USG request; non-streamed: (total s,
    total minus the LLM node's time, i.e. USG's own share outside the engine call)."""
    t0 = time.perf_counter()
    if not stream:
        resp = client.post(f"{url}/v1/infer", json={"inputs": {"question": question}})
        resp.raise_for_status()
        end = time.perf_counter()
        return end - t0, end - t0 - resp.json()["node_ms"]["answer"] / 1e3
    first = None
    with client.stream("POST", f"{url}/v1/infer", json={"inputs": {"question": question}, "stream": True}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if first is None and line == "event: token":
                first = time.perf_counter()
    end = time.perf_counter()
    return end - t0, (first or end) - t0


def _alternate(n: int, direct: Any, usg: Any) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    d: list[tuple[float, float]] = []
    u: list[tuple[float, float]] = []
    for i in range(n):  # alternate the order so drift hits both sides alike
        if i % 2:
            d.append(direct())
            u.append(usg())
        else:
            u.append(usg())
            d.append(direct())
    return d, u


async def _throughput(clients: int, per_client: int, send: Any) -> tuple[int, float]:
    """(questions answered, seconds) of ``clients`` closed-loop clients."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients)) as client:

        async def worker(k: int) -> None:
            for i in range(per_client):
                await send(client, f"{QUESTION} ({k}.{i})")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        return clients * per_client, time.perf_counter() - t0


def _start_bare(eurl: str, model: str, max_tokens: int, inflight: int, log: Path) -> ServerProcess:
    """``benchmarks/bare_llm_proxy.py`` on a free port, ready."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("bare_llm_proxy.py"))]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, eurl, model, str(port), str(max_tokens), str(inflight)], stdout=out, stderr=subprocess.STDOUT
        )
    bare = ServerProcess(proc, port, log)
    bare.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", name="bare proxy", timeout_s=60, poll_s=0.1)
    return bare


def _p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def run_placement(placement: str, args: argparse.Namespace, model_dir: Path, tmp: Path) -> dict[str, Any]:
    """One full measurement (latency, TTFT, plain and streamed throughput) with its own engine,
    ``usg serve`` and bare proxy, in ``placement`` (``llm_placement.PLACEMENTS``): unpinned (the
    engine's torch threads, the proxies and the clients share every core; the engine's OpenMP
    variables as the placement sets them) or ``split`` (the engine on ``args.engine_cpus``, torch
    threads = those cores; this process's clients, ``usg serve`` and the bare proxy on the others)."""
    pl = PLACEMENTS[placement]
    everything = os.sched_getaffinity(0)
    if pl.pinned:
        engine_cpus = args.engine_cpus
        proxy_cpus = everything - engine_cpus
    else:
        engine_cpus = proxy_cpus = everything
    omp = engine_env(pl, args.engine_threads, engine_cpus)
    threads = None if omp["OMP_NUM_THREADS"] is None else int(omp["OMP_NUM_THREADS"])
    extra_env = {k: v for k, v in omp.items() if k != "OMP_NUM_THREADS" and v is not None}
    tmp = tmp / placement
    tmp.mkdir()
    if pl.pinned:
        pin_threads(os.getpid(), proxy_cpus)  # the clients (and whatever this process spawns next)
    engine = usg_server = bare = None
    try:
        with spawning_on(engine_cpus if pl.pinned else None):
            engine = start_engine(model_dir, tmp / "engine.log", threads=threads, env=extra_env)
        eurl = f"http://127.0.0.1:{engine.port}"
        model = httpx.get(f"{eurl}/v1/models").json()["data"][0]["id"]
        graph = tmp / "graph.yaml"
        graph.write_text(GRAPH.format(url=eurl, model=model, max_tokens=args.max_tokens, inflight=args.clients))
        usg_server = start_server(graph, "--max-inflight", str(max(64, args.clients * 2)), tmp=tmp)
        uurl = usg_server.url
        bare = _start_bare(eurl, model, args.max_tokens, args.clients, tmp / "bare.log")
        burl = f"http://127.0.0.1:{bare.port}"
        pids = {"usg": usg_server.proc.pid, "bare": bare.proc.pid}
        epid = engine.proc.pid
        procs = {"engine": epid, "usg serve": pids["usg"], "bare proxy": pids["bare"]}
        procs["clients"] = os.getpid()
        expected = {"engine": engine_cpus, "usg serve": proxy_cpus, "bare proxy": proxy_cpus, "clients": proxy_cpus}
        plain, streamed = (_direct_body(model, args.max_tokens, QUESTION, s) for s in (False, True))
        with httpx.Client(timeout=300) as client:
            for _ in range(3):  # warm both paths (first generation, connections)
                _direct(client, eurl, plain)
                _direct(client, eurl, streamed)
                _usg(client, uurl, QUESTION, stream=False)
                _usg(client, uurl, QUESTION, stream=True)
                client.post(f"{burl}/v1/infer", json={"inputs": {"question": QUESTION}}).raise_for_status()
            pinning = [check_engine_env(epid, omp)]
            pinning += check_pinning("after warm-up", procs, expected)
            print(f"latency: {args.requests} text-only questions per side, alternating ...", flush=True)
            cpu0 = cpu_s(usg_server.proc.pid)
            d_lat, u_lat = _alternate(
                args.requests, lambda: _direct(client, eurl, plain), lambda: _usg(client, uurl, QUESTION, False)
            )
            usg_cpu_ms = (cpu_s(usg_server.proc.pid) - cpu0) / args.requests * 1e3
            print(f"time to first token: {args.requests} streamed questions per side ...", flush=True)
            cpu0 = cpu_s(usg_server.proc.pid)
            d_tt, u_tt = _alternate(
                args.requests, lambda: _direct(client, eurl, streamed), lambda: _usg(client, uurl, QUESTION, True)
            )
            usg_cpu_stream_ms = (cpu_s(usg_server.proc.pid) - cpu0) / args.requests * 1e3

        def sender(side: str, stream: bool) -> Any:
            async def send(client: httpx.AsyncClient, q: str) -> None:
                if side == "direct":
                    url, body = f"{eurl}/v1/chat/completions", _direct_body(model, args.max_tokens, q, stream)
                else:
                    base = uurl if side == "usg" else burl
                    url, body = f"{base}/v1/infer", {"inputs": {"question": q}, "stream": stream}
                async with client.stream("POST", url, json=body) as r:
                    r.raise_for_status()
                    async for _ in r.aiter_bytes():
                        pass

            return send

        rps: dict[bool, dict[str, float]] = {}
        load_cpu: dict[str, float] = {}
        client_cpu: dict[str, float] = {}
        busy: dict[bool, dict[str, dict[int, float]]] = {}
        engine_cpu: dict[bool, dict[str, float]] = {}  # the engine's CPU ms a question, per side
        engine_threads: dict[bool, dict[str, list[float]]] = {}  # each engine thread's share of a core
        for stream in (False, True):
            order = ("direct", "usg", "usg", "direct") if stream else ("direct", "usg", "bare", "bare", "usg", "direct")
            print(
                f"throughput{' (streamed)' if stream else ''}: {args.clients} concurrent clients x "
                f"{args.per_client} questions per side and round, 2 rounds ({', '.join(order)}) ...",
                flush=True,
            )
            totals = {side: [0, 0.0, 0.0, 0.0] for side in order}
            ticks: dict[str, dict[int, list[int]]] = {side: {} for side in order}
            per_thread: dict[str, dict[int, float]] = {side: {} for side in order}
            for side in order:
                cpu0 = cpu_s(pids[side]) if side in pids else 0.0
                me0, core0, eng0 = cpu_s(os.getpid()), core_ticks(), thread_cpu_s(epid)
                done, secs = asyncio.run(_throughput(args.clients, args.per_client, sender(side, stream)))
                core1, eng1 = core_ticks(), thread_cpu_s(epid)
                print(f"  {side}: {done} questions in {secs:.2f} s, {done / secs:.1f} req/s", flush=True)
                totals[side][0] += done
                totals[side][1] += secs
                totals[side][2] += cpu_s(pids[side]) - cpu0 if side in pids else 0.0
                totals[side][3] += cpu_s(os.getpid()) - me0
                for c, (b1, t1) in core1.items():
                    acc = ticks[side].setdefault(c, [0, 0])
                    acc[0] += b1 - core0[c][0]
                    acc[1] += t1 - core0[c][1]
                for tid, t1 in eng1.items():
                    per_thread[side][tid] = per_thread[side].get(tid, 0.0) + t1 - eng0.get(tid, 0.0)
            rps[stream] = {side: done / secs for side, (done, secs, _, _) in totals.items()}
            if not stream:
                load_cpu = {side: cpu / done * 1e3 for side, (done, _, cpu, _) in totals.items() if side in pids}
                client_cpu = {side: me / done * 1e3 for side, (done, _, _, me) in totals.items()}
            busy[stream] = {side: {c: b / max(t, 1) for c, (b, t) in cores.items()} for side, cores in ticks.items()}
            engine_cpu[stream] = {side: sum(per_thread[side].values()) / totals[side][0] * 1e3 for side in per_thread}
            engine_threads[stream] = {side: busy_threads({}, per_thread[side], totals[side][1]) for side in per_thread}
        pinning += check_pinning("after the rounds", procs, expected)
        n = int(totals["usg"][0])
        n_engine_threads = len(thread_cpu_s(epid))
    finally:
        for proc in (usg_server, bare, engine):
            if proc is not None:
                proc.stop()
        if pl.pinned:
            pin_threads(os.getpid(), everything)

    return {
        "placement": placement,
        "engine_cpus": engine_cpus,
        "proxy_cpus": proxy_cpus,
        "omp": omp,
        "n": n,
        "d_lat": d_lat,
        "u_lat": u_lat,
        "d_tt": d_tt,
        "u_tt": u_tt,
        "usg_cpu_ms": usg_cpu_ms,
        "usg_cpu_stream_ms": usg_cpu_stream_ms,
        "rps": rps,
        "load_cpu": load_cpu,
        "client_cpu": client_cpu,
        "busy": busy,
        "engine_cpu": engine_cpu,
        "engine_threads": engine_threads,
        "n_engine_threads": n_engine_threads,
        "pinning": pinning,
    }


def report(r: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """Print one placement's table; return its headline figures."""
    d_lat, u_lat, d_tt, u_tt, rps, load_cpu = (r[k] for k in ("d_lat", "u_lat", "d_tt", "u_tt", "rps", "load_cpu"))
    lat_d, lat_u = _p50_ms([t for t, _ in d_lat]), _p50_ms([t for t, _ in u_lat])
    tt_d, tt_u = _p50_ms([f for _, f in d_tt]), _p50_ms([f for _, f in u_tt])
    paired = statistics.median([(u[0] - d[0]) * 1e3 for d, u in zip(d_lat, u_lat, strict=True)])
    paired_tt = statistics.median([(u[1] - d[1]) * 1e3 for d, u in zip(d_tt, u_tt, strict=True)])
    own = _p50_ms([o for _, o in u_lat])
    print()
    omp = "  ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in r["omp"].items())
    if r["placement"] == "split":
        print(
            f"== placement split: engine pinned to cpu {fmt_cpus(r['engine_cpus'])} ({omp}); "
            f"clients, usg serve and the bare proxy pinned to cpu {fmt_cpus(r['proxy_cpus'])} =="
        )
    else:
        print(
            f"== placement {r['placement']}: no pinning (engine, usg serve, bare proxy and clients share every "
            f"core); engine {omp} =="
        )
    print(f"{'measure':<38}{'direct':>10}{'via USG':>10}{'added':>10}{'target':>10}")
    print(
        f"{'p50 latency, text-only question (ms)':<38}{lat_d:>10.1f}{lat_u:>10.1f}{lat_u - lat_d:>+10.1f}{'<= 3':>10}"
    )
    print(f"{'p50 time to first token (ms)':<38}{tt_d:>10.1f}{tt_u:>10.1f}{tt_u - tt_d:>+10.1f}{'<= 3':>10}")
    print(f"{'median paired difference, latency (ms)':<38}{'':>10}{'':>10}{paired:>+10.1f}")
    print(f"{'median paired difference, TTFT (ms)':<38}{'':>10}{'':>10}{paired_tt:>+10.1f}")
    print(f"{'p50 USG time outside the engine call':<38}{'':>10}{'':>10}{own:>+10.1f}{'<= 3':>10}")
    print(f"{'usg serve CPU per question (ms)':<38}{'':>10}{r['usg_cpu_ms']:>10.2f}")
    print(f"{'usg serve CPU per streamed question':<38}{'':>10}{r['usg_cpu_stream_ms']:>10.2f}")
    for stream, label in ((False, f"throughput, {args.clients} clients"), (True, "  the same, streamed")):
        direct_rps, usg_rps = rps[stream]["direct"], rps[stream]["usg"]
        print(
            f"{label + ' (req/s)':<38}{direct_rps:>10.2f}{usg_rps:>10.2f}{usg_rps / direct_rps:>9.3f}x{'>= 0.95x':>10}"
        )
    bare_rps = rps[False]["bare"]
    print(f"{'  a bare proxy instead of USG (req/s)':<38}{rps[False]['direct']:>10.2f}{bare_rps:>10.2f}", end="")
    print(f"{bare_rps / rps[False]['direct']:>9.3f}x   (floor)")
    print(f"{'  USG / the bare proxy':<38}{'':>20}{rps[False]['usg'] / bare_rps:>9.3f}x")
    print(f"{'CPU per question under load, USG/bare':<38}{load_cpu['usg']:>10.2f}{load_cpu['bare']:>10.2f}{'ms':>10}")
    cc = r["client_cpu"]
    print(
        f"{'clients CPU per question, direct/USG/bare':<38}{cc['direct']:>10.2f}{cc['usg']:>10.2f}{cc['bare']:>10.2f}"
        f"{'ms':>10}"
    )
    ec = r["engine_cpu"][False]
    print(
        f"{'engine CPU per question, direct/USG/bare':<38}{ec['direct']:>10.2f}{ec['usg']:>10.2f}{ec['bare']:>10.2f}"
        f"{'ms':>10}"
    )
    shared = r["placement"] != "split"
    roles = {c: "engine+proxy" if shared else "engine" for c in r["engine_cpus"]}
    if not shared:
        roles.update({c: "proxy" for c in r["proxy_cpus"]})
    cores = "  ".join(f"cpu{c} ({role})" for c, role in sorted(roles.items()))
    print(f"core utilisation over the rounds: {cores}")
    for stream, side in ((False, "direct"), (False, "usg"), (False, "bare"), (True, "direct"), (True, "usg")):
        util = "  ".join(f"{r['busy'][stream][side].get(c, 0.0) * 100:5.1f}%" for c in sorted(roles))
        print(f"  {side + (' streamed' if stream else ''):<16}{util}")
    print(
        f"engine threads ({r['n_engine_threads']} in the process), each one's share of a core over the rounds "
        "(those above 1%; /proc/PID/task/*/schedstat):"
    )
    for stream, side in ((False, "direct"), (False, "usg"), (False, "bare"), (True, "direct"), (True, "usg")):
        shares = [f"{x * 100:5.1f}%" for x in r["engine_threads"][stream][side] if x > 0.01]
        print(f"  {side + (' streamed' if stream else ''):<16}{'  '.join(shares)}")
    print(f"({r['n']} questions per side; max_tokens {args.max_tokens}; engine: transformers serve, CPU, {omp})")
    return {
        "direct": rps[False]["direct"],
        "direct_streamed": rps[True]["direct"],
        "usg_rps": rps[False]["usg"],
        "bare_rps": bare_rps,
        "usg_streamed_rps": rps[True]["usg"],
        "usg": rps[False]["usg"] / rps[False]["direct"],
        "bare": bare_rps / rps[False]["direct"],
        "usg_bare": rps[False]["usg"] / bare_rps,
        "streamed": rps[True]["usg"] / rps[True]["direct"],
        "lat": lat_u - lat_d,
        "ttft": tt_u - tt_d,
        "cpu": load_cpu["usg"],
        "cpu_bare": load_cpu["bare"],
        "engine_cpu": ec["direct"],
        "engine_threads": sum(x > 0.10 for x in r["engine_threads"][False]["direct"]),
        "proxy_busy": sum(r["busy"][False]["usg"].get(c, 0.0) for c in r["proxy_cpus"]) / len(r["proxy_cpus"]),
    }


def print_summary(summary: list[tuple[str, dict[str, float]]]) -> None:
    """One row per placement, its ratios against its own direct calls and against the best direct
    calls of the run (the engine configuration a deployment would pick: the honest baseline)."""
    best = max(summary, key=lambda ps: ps[1]["direct"])
    best_s = max(summary, key=lambda ps: ps[1]["direct_streamed"])
    b, bs = best[1]["direct"], best_s[1]["direct_streamed"]
    print()
    print(
        f"best direct of the run: plain {b:.2f} req/s ({best[0]}), streamed {bs:.2f} req/s ({best_s[0]}); "
        "'/best' = this placement's USG (or bare) rate / that"
    )
    print(
        f"{'placement':<15}{'direct':>8}{'streamed':>9}{'USG/direct':>11}{'USG/best':>9}{'bare/direct':>12}"
        f"{'bare/best':>10}{'USG/bare':>9}{'str./direct':>12}{'str./best':>10}{'p50 added':>10}{'TTFT added':>11}"
    )
    for placement, s in summary:
        print(
            f"{placement:<15}{s['direct']:>8.2f}{s['direct_streamed']:>9.2f}{s['usg']:>10.3f}x"
            f"{s['usg_rps'] / b:>8.3f}x{s['bare']:>11.3f}x{s['bare_rps'] / b:>9.3f}x{s['usg_bare']:>8.3f}x"
            f"{s['streamed']:>11.3f}x{s['usg_streamed_rps'] / bs:>9.3f}x{s['lat']:>+10.1f}{s['ttft']:>+11.1f}"
        )
    print(
        f"{'placement':<15}{'CPU/question USG/bare':>22}{'engine CPU/question direct':>28}"
        f"{'engine threads >10% (direct)':>30}{'proxy cores':>12}"
    )
    for placement, s in summary:
        print(
            f"{placement:<15}{s['cpu']:>16.2f}/{s['cpu_bare']:.2f}{s['engine_cpu']:>25.2f} ms"
            f"{s['engine_threads']:>30}{s['proxy_busy'] * 100:>11.0f}%"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40, help="sequential questions per side (latency, TTFT)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--engine-threads",
        type=int,
        default=None,
        help="torch intra-op threads (OMP_NUM_THREADS) of the engine in the shared and shared-passive "
        "placements (default: unset, torch's choice: one per core, sharing them with usg serve); shared1 is "
        "always 1, split the number of --engine-cpus",
    )
    ap.add_argument(
        "--placement",
        default="shared",
        help="comma-separated, run in this order: shared (no pinning, the default), shared1 (no pinning, the "
        "engine at one torch thread), shared-passive (no pinning, OMP_WAIT_POLICY=PASSIVE), split (the engine "
        "on --engine-cpus, the clients and the proxies on the other cores, as with an engine on a GPU)",
    )
    ap.add_argument(
        "--engine-cpus",
        type=cpu_list,
        default=None,
        help="the engine's cores in the split placement, e.g. 1 or 2-3 (default: the upper half of this "
        "process's cores)",
    )
    args = ap.parse_args()
    placements = [p.strip() for p in args.placement.split(",") if p.strip()]
    for p in placements:
        if p not in PLACEMENTS:
            ap.error(
                f"--placement {args.placement!r}: {p!r} is not a placement; use one or more of "
                f"{', '.join(PLACEMENTS)}, comma-separated (e.g. shared,shared1)"
            )
    if not placements or len(set(placements)) != len(placements):
        ap.error(f"--placement {args.placement!r}: name each placement once (e.g. shared,shared1)")
    cores = sorted(os.sched_getaffinity(0))
    if args.engine_cpus is None:
        args.engine_cpus = set(cores[len(cores) // 2 :])
    if "split" in placements:
        if len(cores) < 2:
            ap.error(f"--placement split needs 2 or more cores; this process may run on {len(cores)}")
        if not args.engine_cpus < set(cores):
            ap.error(
                f"--engine-cpus {fmt_cpus(args.engine_cpus)}: must be some, not all, of this process's cores "
                f"({fmt_cpus(set(cores))}); leave the others to the clients and the proxies"
            )
    tmp = Path(tempfile.mkdtemp(prefix="llm-overhead-"))
    print("building the tiny model ...", flush=True)
    model_dir = build_tiny_llama(tmp / "model")
    summary = []
    for placement in placements:
        print(f"placement {placement}: starting transformers serve, usg serve and the bare proxy ...", flush=True)
        result = run_placement(placement, args, model_dir, tmp)
        summary.append((placement, report(result, args)))
    print()
    print(
        "USG time outside the engine call = client-observed total - the LLM node's node_ms (HTTP in and out, "
        "prompt node, JSON); unlike the A/B difference it does not carry the engine's run-to-run variance; "
        "usg serve CPU = the server process's run time over the latency phase (streamed: the TTFT phase), per "
        "question (everything USG does, its own engine client included; the least load-sensitive figure); the "
        "bare proxy (benchmarks/bare_llm_proxy.py): uvicorn + USG's engine client, no graph, limits or metrics — "
        "what any process between the clients and a CPU engine on the same cores costs; core utilisation = "
        "busy share of each core (/proc/stat) over each side's rounds (split: when the proxy core is near "
        "100% the proxy side, not the engine, was the limit); engine threads = each thread's run time over the "
        "rounds' wall time (a torch/OpenMP thread that spin-waits for work counts as busy)"
    )
    if len(summary) > 1:
        print_summary(summary)


if __name__ == "__main__":
    main()
