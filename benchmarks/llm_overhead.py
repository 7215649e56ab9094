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
   questions and once streamed (each side's clients read the tokens as they come; a streamed
   answer counts only if it ends as a finished one: ``data: [DONE]`` or a ``finish_reason`` from
   the engine, an
   ``event: result`` and no ``event: error`` from a proxy); both also run a bare proxy
   (``benchmarks/bare_llm_proxy.py``: uvicorn + USG's engine client, no graph; streamed, it
   forwards each engine chunk's deltas as token events) — the floor any process in front of the
   engine pays on this machine's two cores, which the engine's threads share.

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

Proxy CPU policies (``--proxy-policy normal,batch,nice19``; ``llm_placement.PROXY_POLICIES``): each
policy gets its own ``usg serve`` and bare proxy, every thread of both put under it right after they
start (``SCHED_BATCH``: a woken thread does not preempt the running one; nice 10 / 19; ``SCHED_IDLE``),
all against the same engine, in the same palindromic rounds (direct, then each policy's USG and bare
sides, then back); the policy of every proxy thread is read back after the warm-up and after the
rounds. Per side it prints the engine threads' nonvoluntary context switches a question, the
engine's CPU a question, and each proxy's wake-ups (voluntary switches) and wait for a core a
question (``schedstat``): the test of whether a proxy's wake-ups preempting the engine's OpenMP
threads is what costs throughput. The default, ``normal``, is the measurement of the sessions before.

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
import re
import signal
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
    PROXY_POLICIES,
    busy_threads,
    check_engine_env,
    check_pinning,
    core_ticks,
    cpu_list,
    cpu_s,
    ctxt_switches,
    engine_env,
    fmt_cpus,
    pin_threads,
    read_proxy_policy,
    run_delay_s,
    set_proxy_policy,
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
FINISHED = re.compile(rb'^data: .*"finish_reason": ?"')  # an engine's last chunk, stopped for a reason


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


def _usg_streamed_answer(client: httpx.Client, url: str) -> None:
    """One streamed question to a proxy at ``url`` (the warm-up), read and checked to its end."""
    with client.stream("POST", f"{url}/v1/infer", json={"inputs": {"question": QUESTION}, "stream": True}) as resp:
        resp.raise_for_status()
        body = resp.read()
    check_streamed("warm-up", body)


def check_streamed(name: str, body: bytes) -> None:
    """Raise unless ``body`` is a finished streamed answer: the engine's (side ``direct``) last
    ``data:`` line is ``[DONE]`` or a chunk with a ``finish_reason`` (``transformers serve`` sends no
    ``[DONE]``); a proxy's (``usg serve``, the bare proxy) has an ``event: result`` and no
    ``event: error``."""
    if name == "direct":
        last = body.rstrip().rpartition(b"\n")[2]
        if last == b"data: [DONE]" or FINISHED.search(last):
            return
    else:
        events = b"\n" + body
        if b"\nevent: result\n" in events and b"\nevent: error\n" not in events:
            return
    raise RuntimeError(f"side {name}: a streamed answer did not finish; its last bytes: {body[-300:]!r}")


def _alternate(n: int, sides: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """``n`` questions a side, one at a time; the order of the sides rotates (and turns around every
    other question) so drift hits every side alike."""
    names = list(sides)
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(n):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in reversed(order) if i % 2 else order:
            out[name].append(sides[name]())
    return out


def side(kind: str, policy: str) -> str:
    """The name of the ``usg`` or ``bare`` side run under CPU policy ``policy`` (``normal``: the plain
    name, as before policies; ``POLICY@TREE``: the same policy, running the source tree ``--usg-src``
    names ``TREE``)."""
    return kind if policy == "normal" else f"{kind}:{policy}"


def base_policy(policy: str) -> str:
    """The CPU policy of a side's ``policy`` (``POLICY@TREE`` → ``POLICY``)."""
    return policy.partition("@")[0]


def tree_env(policy: str, trees: dict[str, str]) -> dict[str, str] | None:
    """The environment of a ``POLICY@TREE`` side's processes (``PYTHONPATH`` = that tree's ``src``);
    None: this process's (the tree ``PYTHONPATH`` gives the benchmark)."""
    tree = policy.partition("@")[2]
    return {**os.environ, "PYTHONPATH": trees[tree]} if tree else None


async def _throughput(clients: int, per_client: int, send: Any) -> tuple[int, float]:
    """(questions answered, seconds) of ``clients`` closed-loop clients."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients)) as client:

        async def worker(k: int) -> None:
            for i in range(per_client):
                await send(client, f"{QUESTION} ({k}.{i})")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        return clients * per_client, time.perf_counter() - t0


def _start_bare(
    eurl: str, model: str, max_tokens: int, inflight: int, log: Path, env: dict[str, str] | None = None
) -> ServerProcess:
    """``benchmarks/bare_llm_proxy.py`` on a free port, ready (``env``: its environment, None: this one's)."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("bare_llm_proxy.py"))]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, eurl, model, str(port), str(max_tokens), str(inflight)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
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
    policies = args.proxy_policy
    engine = None
    servers: dict[str, ServerProcess] = {}  # side → process (usg serve, bare proxy), per CPU policy
    try:
        with spawning_on(engine_cpus if pl.pinned else None):
            engine = start_engine(model_dir, tmp / "engine.log", threads=threads, env=extra_env)
        eurl = f"http://127.0.0.1:{engine.port}"
        model = httpx.get(f"{eurl}/v1/models").json()["data"][0]["id"]
        graph = tmp / "graph.yaml"
        graph.write_text(GRAPH.format(url=eurl, model=model, max_tokens=args.max_tokens, inflight=args.clients))
        urls: dict[str, str] = {}
        for policy in policies:
            u, b = side("usg", policy), side("bare", policy)
            env = tree_env(policy, args.usg_src)
            usg_server = start_server(graph, "--max-inflight", str(max(64, args.clients * 2)), tmp=tmp, env=env)
            servers[u], urls[u] = usg_server, usg_server.url
            bare = _start_bare(eurl, model, args.max_tokens, args.clients, tmp / f"bare-{policy}.log", env)
            servers[b], urls[b] = bare, f"http://127.0.0.1:{bare.port}"
            for proc in (usg_server, bare):  # before any question: threads started later inherit it
                set_proxy_policy(proc.proc.pid, base_policy(policy))
        usg_sides = [side("usg", policy) for policy in policies]
        pids = {name: proc.proc.pid for name, proc in servers.items()}
        epid = engine.proc.pid
        procs = {"engine": epid, **{name: pid for name, pid in pids.items()}, "clients": os.getpid()}
        expected = {name: proxy_cpus for name in procs}
        expected["engine"] = engine_cpus
        plain, streamed = (_direct_body(model, args.max_tokens, QUESTION, s) for s in (False, True))
        with httpx.Client(timeout=300) as client:
            for _ in range(3):  # warm every path (first generation, connections)
                _direct(client, eurl, plain)
                _direct(client, eurl, streamed)
                for policy in policies:
                    _usg(client, urls[side("usg", policy)], QUESTION, stream=False)
                    _usg(client, urls[side("usg", policy)], QUESTION, stream=True)
                    burl = urls[side("bare", policy)]
                    client.post(f"{burl}/v1/infer", json={"inputs": {"question": QUESTION}}).raise_for_status()
                    _usg_streamed_answer(client, burl)
            pinning = [check_engine_env(epid, omp)]
            pinning += check_pinning("after warm-up", procs, expected)
            pinning += check_policies(policies, pids)
            print(f"latency: {args.requests} text-only questions per side, alternating ...", flush=True)
            cpu0 = {u: cpu_s(pids[u]) for u in usg_sides}
            lat = _alternate(
                args.requests,
                {
                    "direct": lambda: _direct(client, eurl, plain),
                    **{u: (lambda u=u: _usg(client, urls[u], QUESTION, False)) for u in usg_sides},
                },
            )
            usg_cpu_ms = {u: (cpu_s(pids[u]) - cpu0[u]) / args.requests * 1e3 for u in usg_sides}
            print(f"time to first token: {args.requests} streamed questions per side ...", flush=True)
            cpu0 = {u: cpu_s(pids[u]) for u in usg_sides}
            tt = _alternate(
                args.requests,
                {
                    "direct": lambda: _direct(client, eurl, streamed),
                    **{u: (lambda u=u: _usg(client, urls[u], QUESTION, True)) for u in usg_sides},
                },
            )
            usg_cpu_stream_ms = {u: (cpu_s(pids[u]) - cpu0[u]) / args.requests * 1e3 for u in usg_sides}

        def sender(name: str, stream: bool) -> Any:
            async def send(client: httpx.AsyncClient, q: str) -> None:
                if name == "direct":
                    url, body = f"{eurl}/v1/chat/completions", _direct_body(model, args.max_tokens, q, stream)
                else:
                    url, body = f"{urls[name]}/v1/infer", {"inputs": {"question": q}, "stream": stream}
                async with client.stream("POST", url, json=body) as r:
                    r.raise_for_status()
                    if not stream:
                        async for _ in r.aiter_bytes():
                            pass
                        return
                    pieces = [piece async for piece in r.aiter_bytes()]
                check_streamed(name, b"".join(pieces))

            return send

        rps: dict[bool, dict[str, float]] = {}
        pal_rps: dict[bool, list[dict[str, float]]] = {}  # per palindrome, each side's req/s
        load_cpu: dict[str, float] = {}
        load_cpu_streamed: dict[str, float] = {}
        client_cpu: dict[str, float] = {}
        busy: dict[bool, dict[str, dict[int, float]]] = {}
        engine_cpu: dict[bool, dict[str, float]] = {}  # the engine's CPU ms a question, per side
        engine_threads: dict[bool, dict[str, list[float]]] = {}  # each engine thread's share of a core
        # per side, per question: the engine threads' nonvoluntary switches, the proxy's voluntary and
        # nonvoluntary switches and its wait for a core (ms)
        switches: dict[bool, dict[str, dict[str, float]]] = {}
        for stream in (False, True):
            ahead = [side(kind, policy) for policy in policies for kind in ("usg", "bare")]
            palindrome = ("direct", *ahead, *reversed(ahead), "direct")
            print(
                f"throughput{' (streamed)' if stream else ''}: {args.clients} concurrent clients x "
                f"{args.per_client} questions per side and round, 2 rounds ({', '.join(palindrome)})"
                f"{f' x {args.palindromes} palindromes' if args.palindromes > 1 else ''} ...",
                flush=True,
            )
            order = palindrome * args.palindromes
            per_pal: list[dict[str, list[float]]] = [
                {name: [0, 0.0] for name in palindrome} for _ in range(args.palindromes)
            ]  # each palindrome's questions and seconds per side
            totals = {name: [0, 0.0, 0.0, 0.0] for name in palindrome}
            ticks: dict[str, dict[int, list[int]]] = {name: {} for name in order}
            per_thread: dict[str, dict[int, float]] = {name: {} for name in order}
            sw = {
                name: {"engine_nvcsw": 0.0, "proxy_vcsw": 0.0, "proxy_nvcsw": 0.0, "proxy_wait": 0.0} for name in order
            }
            for i, name in enumerate(order):
                cpu0 = cpu_s(pids[name]) if name in pids else 0.0
                me0, core0, eng0 = cpu_s(os.getpid()), core_ticks(), thread_cpu_s(epid)
                ecs0 = ctxt_switches(epid)
                pcs0 = ctxt_switches(pids[name]) if name in pids else {}
                wait0 = run_delay_s(pids[name]) if name in pids else 0.0
                done, secs = asyncio.run(_throughput(args.clients, args.per_client, sender(name, stream)))
                core1, eng1, ecs1 = core_ticks(), thread_cpu_s(epid), ctxt_switches(epid)
                if name in pids:
                    pcs1 = ctxt_switches(pids[name])
                    sw[name]["proxy_vcsw"] += sum(v[0] - pcs0.get(t, (0, 0))[0] for t, v in pcs1.items())
                    sw[name]["proxy_nvcsw"] += sum(v[1] - pcs0.get(t, (0, 0))[1] for t, v in pcs1.items())
                    sw[name]["proxy_wait"] += run_delay_s(pids[name]) - wait0
                sw[name]["engine_nvcsw"] += sum(v[1] - ecs0.get(t, (0, 0))[1] for t, v in ecs1.items())
                print(f"  {name}: {done} questions in {secs:.2f} s, {done / secs:.1f} req/s", flush=True)
                totals[name][0] += done
                totals[name][1] += secs
                per_pal[i // len(palindrome)][name][0] += done
                per_pal[i // len(palindrome)][name][1] += secs
                totals[name][2] += cpu_s(pids[name]) - cpu0 if name in pids else 0.0
                totals[name][3] += cpu_s(os.getpid()) - me0
                for c, (b1, t1) in core1.items():
                    acc = ticks[name].setdefault(c, [0, 0])
                    acc[0] += b1 - core0[c][0]
                    acc[1] += t1 - core0[c][1]
                for tid, t1 in eng1.items():
                    per_thread[name][tid] = per_thread[name].get(tid, 0.0) + t1 - eng0.get(tid, 0.0)
            rps[stream] = {name: done / secs for name, (done, secs, _, _) in totals.items()}
            pal_rps[stream] = [{name: d / t for name, (d, t) in pal.items()} for pal in per_pal]
            switches[stream] = {
                name: {k: (v * 1e3 if k == "proxy_wait" else v) / totals[name][0] for k, v in d.items()}
                for name, d in sw.items()
            }
            if not stream:
                load_cpu = {name: cpu / done * 1e3 for name, (done, _, cpu, _) in totals.items() if name in pids}
                client_cpu = {name: me / done * 1e3 for name, (done, _, _, me) in totals.items()}
            else:
                load_cpu_streamed = {
                    name: cpu / done * 1e3 for name, (done, _, cpu, _) in totals.items() if name in pids
                }
            busy[stream] = {name: {c: b / max(t, 1) for c, (b, t) in cores.items()} for name, cores in ticks.items()}
            engine_cpu[stream] = {name: sum(per_thread[name].values()) / totals[name][0] * 1e3 for name in per_thread}
            engine_threads[stream] = {name: busy_threads({}, per_thread[name], totals[name][1]) for name in per_thread}
        pinning += check_pinning("after the rounds", procs, expected)
        pinning += check_policies(policies, pids)
        n = int(totals[usg_sides[0]][0])
        n_engine_threads = len(thread_cpu_s(epid))
    finally:
        for proc in (*servers.values(), engine):
            if proc is not None:
                proc.stop()
        if pl.pinned:
            pin_threads(os.getpid(), everything)

    return {
        "placement": placement,
        "policies": policies,
        "engine_cpus": engine_cpus,
        "proxy_cpus": proxy_cpus,
        "omp": omp,
        "n": n,
        "lat": lat,
        "tt": tt,
        "usg_cpu_ms": usg_cpu_ms,
        "usg_cpu_stream_ms": usg_cpu_stream_ms,
        "rps": rps,
        "pal_rps": pal_rps,
        "load_cpu": load_cpu,
        "load_cpu_streamed": load_cpu_streamed,
        "client_cpu": client_cpu,
        "busy": busy,
        "engine_cpu": engine_cpu,
        "engine_threads": engine_threads,
        "n_engine_threads": n_engine_threads,
        "switches": switches,
        "pinning": pinning,
    }


def check_policies(policies: list[str], pids: dict[str, int]) -> list[str]:
    """Read back the scheduling policy and nice of every thread of every proxy process; one line
    each; exit if one is not its side's CPU policy."""
    lines, wrong = [], []
    for policy in policies:
        want_policy, want_nice = PROXY_POLICIES[base_policy(policy)]
        for kind in ("usg", "bare"):
            name = side(kind, policy)
            got = read_proxy_policy(pids[name])
            seen = sorted({f"{pol} nice {nice}" for pol, nice in got})
            ok = all(pol == want_policy and nice == want_nice for pol, nice in got)
            lines.append(
                f"  {name:<16} pid {pids[name]:>7}  {len(got):>3} threads  {' | '.join(seen)}  "
                f"(expected {want_policy} nice {want_nice}) {'ok' if ok else 'WRONG'}"
            )
            if not ok:
                wrong.append(name)
    print("\n".join(lines), flush=True)
    if wrong:
        raise SystemExit(f"the CPU policy did not hold for {', '.join(wrong)}: see the lines above")
    return lines


def report(r: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Print one placement's table (a column per CPU policy of the proxies); return its headline
    figures per policy."""
    rps, load_cpu, policies = r["rps"], r["load_cpu"], r["policies"]
    d_lat, d_tt = r["lat"]["direct"], r["tt"]["direct"]
    lat_d, tt_d = _p50_ms([t for t, _ in d_lat]), _p50_ms([f for _, f in d_tt])
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
    print(f"p50 latency, text-only question: direct {lat_d:.1f} ms; p50 time to first token: direct {tt_d:.1f} ms")
    print(f"{'proxy CPU policy (--proxy-policy)':<44}" + "".join(f"{p:>12}" for p in policies) + "  target")
    heads: dict[str, dict[str, float]] = {}

    def row(label: str, cells: list[str], target: str = "") -> None:
        print(f"{label:<44}" + "".join(f"{c:>12}" for c in cells) + (f"  {target}" if target else ""))

    per: dict[str, dict[str, float]] = {}
    for policy in policies:
        u, b = side("usg", policy), side("bare", policy)
        u_lat, u_tt = r["lat"][u], r["tt"][u]
        lat_u, tt_u = _p50_ms([t for t, _ in u_lat]), _p50_ms([f for _, f in u_tt])
        sw, sws = r["switches"][False], r["switches"][True]
        per[policy] = {
            "lat_u": lat_u,
            "lat": lat_u - lat_d,
            "ttft": tt_u - tt_d,
            "paired": statistics.median([(x[0] - d[0]) * 1e3 for d, x in zip(d_lat, u_lat, strict=True)]),
            "paired_tt": statistics.median([(x[1] - d[1]) * 1e3 for d, x in zip(d_tt, u_tt, strict=True)]),
            "own": _p50_ms([o for _, o in u_lat]),
            "cpu_seq": r["usg_cpu_ms"][u],
            "cpu_seq_stream": r["usg_cpu_stream_ms"][u],
            "usg_rps": rps[False][u],
            "bare_rps": rps[False][b],
            "usg_streamed_rps": rps[True][u],
            "bare_streamed_rps": rps[True][b],
            "usg": rps[False][u] / rps[False]["direct"],
            "bare": rps[False][b] / rps[False]["direct"],
            "usg_bare": rps[False][u] / rps[False][b],
            "streamed": rps[True][u] / rps[True]["direct"],
            "streamed_bare": rps[True][b] / rps[True]["direct"],
            "streamed_usg_bare": rps[True][u] / rps[True][b],
            "cpu_streamed": r["load_cpu_streamed"][u],
            "cpu_bare_streamed": r["load_cpu_streamed"][b],
            "engine_cpu_streamed_usg": r["engine_cpu"][True][u],
            "engine_cpu_streamed_bare": r["engine_cpu"][True][b],
            "engine_nv_streamed_bare": sws[b]["engine_nvcsw"],
            "proxy_wait_streamed_bare": sws[b]["proxy_wait"],
            "cpu": load_cpu[u],
            "cpu_bare": load_cpu[b],
            "engine_cpu_usg": r["engine_cpu"][False][u],
            "engine_cpu_bare": r["engine_cpu"][False][b],
            "engine_nv_usg": sw[u]["engine_nvcsw"],
            "engine_nv_bare": sw[b]["engine_nvcsw"],
            "engine_nv_streamed": sws[u]["engine_nvcsw"],
            "proxy_v_usg": sw[u]["proxy_vcsw"],
            "proxy_nv_usg": sw[u]["proxy_nvcsw"],
            "proxy_wait_usg": sw[u]["proxy_wait"],
            "proxy_v_bare": sw[b]["proxy_vcsw"],
            "proxy_wait_bare": sw[b]["proxy_wait"],
            "proxy_wait_streamed": sws[u]["proxy_wait"],
        }
    ps = [per[p] for p in policies]
    row("p50 latency via USG (ms)", [f"{x['lat_u']:.1f}" for x in ps])
    row("  USG adds (p50 - direct p50, ms)", [f"{x['lat']:+.1f}" for x in ps], "<= 3")
    row("  median paired difference (ms)", [f"{x['paired']:+.1f}" for x in ps])
    row("p50 TTFT added (ms)", [f"{x['ttft']:+.1f}" for x in ps], "<= 3")
    row("  median paired difference (ms)", [f"{x['paired_tt']:+.1f}" for x in ps])
    row("p50 USG time outside the engine call (ms)", [f"{x['own']:.1f}" for x in ps], "<= 3")
    row("usg serve CPU a sequential question (ms)", [f"{x['cpu_seq']:.2f}" for x in ps])
    row("  a streamed one (ms)", [f"{x['cpu_seq_stream']:.2f}" for x in ps])
    direct_rps, direct_s = rps[False]["direct"], rps[True]["direct"]
    print(f"throughput, {args.clients} clients: direct {direct_rps:.2f} req/s plain, {direct_s:.2f} streamed")
    row("  USG (req/s)", [f"{x['usg_rps']:.2f}" for x in ps])
    row("  USG / direct", [f"{x['usg']:.3f}x" for x in ps], ">= 0.95x")
    row("  bare proxy / direct (floor)", [f"{x['bare']:.3f}x" for x in ps])
    row("  USG / bare proxy", [f"{x['usg_bare']:.3f}x" for x in ps])
    row("  streamed USG / direct", [f"{x['streamed']:.3f}x" for x in ps], ">= 0.95x")
    row("  streamed bare proxy / direct (floor)", [f"{x['streamed_bare']:.3f}x" for x in ps])
    row("  streamed USG / bare proxy", [f"{x['streamed_usg_bare']:.3f}x" for x in ps])
    if len(r["pal_rps"][False]) > 1:  # --palindromes: each palindrome's ratio, and their spread
        for stream, label in ((False, "USG / direct"), (True, "streamed USG / direct")):
            for policy in policies:
                ratios = [pal[side("usg", policy)] / pal["direct"] for pal in r["pal_rps"][stream]]
                print(
                    f"  {label} by palindrome{'' if policy == 'normal' else f' ({policy})'}: "
                    + ", ".join(f"{x:.3f}x" for x in ratios)
                    + f"  (median {statistics.median(ratios):.3f}x)"
                )
        for stream, label in ((False, "bare proxy / direct"), (True, "streamed bare proxy / direct")):
            for policy in policies:
                ratios = [pal[side("bare", policy)] / pal["direct"] for pal in r["pal_rps"][stream]]
                print(
                    f"  {label} by palindrome{'' if policy == 'normal' else f' ({policy})'}: "
                    + ", ".join(f"{x:.3f}x" for x in ratios)
                    + f"  (median {statistics.median(ratios):.3f}x)"
                )
    row("CPU a question under load, USG (ms)", [f"{x['cpu']:.2f}" for x in ps])
    row("  bare proxy (ms)", [f"{x['cpu_bare']:.2f}" for x in ps])
    row("  streamed, USG (ms)", [f"{x['cpu_streamed']:.2f}" for x in ps])
    row("  streamed, bare proxy (ms)", [f"{x['cpu_bare_streamed']:.2f}" for x in ps])
    ec, sw = r["engine_cpu"][False], r["switches"][False]
    print(
        f"engine CPU a question (ms): direct {ec['direct']:.2f}; engine threads' nonvoluntary switches a question: "
        f"direct {sw['direct']['engine_nvcsw']:.2f} plain, {r['switches'][True]['direct']['engine_nvcsw']:.2f} streamed"
    )
    row("  engine CPU a question, USG rounds (ms)", [f"{x['engine_cpu_usg']:.2f}" for x in ps])
    row("  the same, bare rounds (ms)", [f"{x['engine_cpu_bare']:.2f}" for x in ps])
    print(f"engine CPU a streamed question (ms): direct {r['engine_cpu'][True]['direct']:.2f}")
    row("  the same, streamed USG rounds (ms)", [f"{x['engine_cpu_streamed_usg']:.2f}" for x in ps])
    row("  the same, streamed bare rounds (ms)", [f"{x['engine_cpu_streamed_bare']:.2f}" for x in ps])
    row("  engine nonvol. switches a q., USG", [f"{x['engine_nv_usg']:.2f}" for x in ps])
    row("  the same, bare", [f"{x['engine_nv_bare']:.2f}" for x in ps])
    row("  the same, streamed USG", [f"{x['engine_nv_streamed']:.2f}" for x in ps])
    row("  the same, streamed bare", [f"{x['engine_nv_streamed_bare']:.2f}" for x in ps])
    row("usg serve wake-ups (vol. switches) a q.", [f"{x['proxy_v_usg']:.2f}" for x in ps])
    row("  its nonvoluntary switches a q.", [f"{x['proxy_nv_usg']:.2f}" for x in ps])
    row("  its wait for a core a q. (ms)", [f"{x['proxy_wait_usg']:.3f}" for x in ps])
    row("  the same, streamed (ms)", [f"{x['proxy_wait_streamed']:.3f}" for x in ps])
    row("bare proxy wake-ups a q.", [f"{x['proxy_v_bare']:.2f}" for x in ps])
    row("  its wait for a core a q. (ms)", [f"{x['proxy_wait_bare']:.3f}" for x in ps])
    row("  the same, streamed (ms)", [f"{x['proxy_wait_streamed_bare']:.3f}" for x in ps])
    cc = r["client_cpu"]
    print("clients CPU per question (ms): " + "  ".join(f"{k} {v:.2f}" for k, v in cc.items()))
    shared = r["placement"] != "split"
    roles = {c: "engine+proxy" if shared else "engine" for c in r["engine_cpus"]}
    if not shared:
        roles.update({c: "proxy" for c in r["proxy_cpus"]})
    cores = "  ".join(f"cpu{c} ({role})" for c, role in sorted(roles.items()))
    print(f"core utilisation over the rounds: {cores}")
    for stream in (False, True):
        for name in r["busy"][stream]:
            util = "  ".join(f"{r['busy'][stream][name].get(c, 0.0) * 100:5.1f}%" for c in sorted(roles))
            print(f"  {name + (' streamed' if stream else ''):<22}{util}")
    print(
        f"engine threads ({r['n_engine_threads']} in the process), each one's share of a core over the rounds "
        "(those above 1%; /proc/PID/task/*/schedstat):"
    )
    for stream in (False, True):
        for name in r["engine_threads"][stream]:
            shares = [f"{x * 100:5.1f}%" for x in r["engine_threads"][stream][name] if x > 0.01]
            print(f"  {name + (' streamed' if stream else ''):<22}{'  '.join(shares)}")
    print(f"({r['n']} questions per side; max_tokens {args.max_tokens}; engine: transformers serve, CPU, {omp})")
    for policy, x in per.items():
        u = side("usg", policy)
        heads[policy] = {
            **x,
            "direct": direct_rps,
            "direct_streamed": direct_s,
            "engine_cpu": ec["direct"],
            "engine_nv_direct": sw["direct"]["engine_nvcsw"],
            "engine_threads": sum(t > 0.10 for t in r["engine_threads"][False]["direct"]),
            "proxy_busy": sum(r["busy"][False][u].get(c, 0.0) for c in r["proxy_cpus"]) / len(r["proxy_cpus"]),
        }
    return heads


def print_summary(summary: list[tuple[str, dict[str, float]]]) -> None:
    """One row per placement (and proxy CPU policy), its ratios against its own direct calls and
    against the best direct calls of the run (the engine configuration a deployment would pick: the
    honest baseline)."""
    best = max(summary, key=lambda ps: ps[1]["direct"])
    best_s = max(summary, key=lambda ps: ps[1]["direct_streamed"])
    b, bs = best[1]["direct"], best_s[1]["direct_streamed"]
    print()
    print(
        f"best direct of the run: plain {b:.2f} req/s ({best[0]}), streamed {bs:.2f} req/s ({best_s[0]}); "
        "'/best' = this placement's USG (or bare) rate / that"
    )
    print(
        f"{'placement/policy':<24}{'direct':>8}{'streamed':>9}{'USG/direct':>11}{'USG/best':>9}{'bare/direct':>12}"
        f"{'bare/best':>10}{'USG/bare':>9}{'str./direct':>12}{'str./best':>10}{'p50 added':>10}{'TTFT added':>11}"
        f"{'str.bare/dir.':>14}{'str.USG/bare':>13}"
    )
    for name, s in summary:
        print(
            f"{name:<24}{s['direct']:>8.2f}{s['direct_streamed']:>9.2f}{s['usg']:>10.3f}x"
            f"{s['usg_rps'] / b:>8.3f}x{s['bare']:>11.3f}x{s['bare_rps'] / b:>9.3f}x{s['usg_bare']:>8.3f}x"
            f"{s['streamed']:>11.3f}x{s['usg_streamed_rps'] / bs:>9.3f}x{s['lat']:>+10.1f}{s['ttft']:>+11.1f}"
            f"{s['streamed_bare']:>13.3f}x{s['streamed_usg_bare']:>12.3f}x"
        )
    print(
        f"{'placement/policy':<24}{'CPU/question USG/bare':>22}{'engine CPU/q direct/USG':>25}"
        f"{'engine nvcsw/q direct/USG/bare':>32}{'engine threads >10%':>21}{'proxy cores':>12}"
    )
    for name, s in summary:
        print(
            f"{name:<24}{s['cpu']:>16.2f}/{s['cpu_bare']:.2f}{s['engine_cpu']:>15.2f}/{s['engine_cpu_usg']:.2f} ms"
            f"{s['engine_nv_direct']:>19.2f}/{s['engine_nv_usg']:.2f}/{s['engine_nv_bare']:.2f}"
            f"{s['engine_threads']:>21}{s['proxy_busy'] * 100:>11.0f}%"
        )


def _exit_on_sigterm(sig: int, frame: Any) -> None:
    raise SystemExit(128 + sig)  # unwinds through run_placement's finally: the engine and servers stop too


def main() -> None:
    # `timeout 600 python benchmarks/llm_overhead.py` signals this process only; without this its children
    # (the engine, usg serve, the bare proxies) were left running, idle, into the next measurement
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40, help="sequential questions per side (latency, TTFT)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--palindromes",
        type=int,
        default=1,
        help="throughput rounds: repeat the palindrome (direct, USG, bare, bare, USG, direct) this many times; "
        "the ratios are over all rounds, and each palindrome's ratio is printed too (default 1)",
    )
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
    ap.add_argument(
        "--proxy-policy",
        default="normal",
        help="comma-separated CPU policies of the proxies: "
        + ", ".join(PROXY_POLICIES)
        + " (SCHED_OTHER nice 0; SCHED_BATCH; nice 10; nice 19; SCHED_IDLE). Each gets its own usg serve and "
        "bare proxy, every thread of both set to it (sched_setscheduler, setpriority) right after they start, "
        "measured against the same engine in the same alternating rounds (default: normal, the measurement of "
        "the sessions before)",
    )
    ap.add_argument(
        "--usg-src",
        default="",
        help="comma-separated NAME=DIR: for each, one more usg serve and bare proxy per CPU policy, run with "
        "PYTHONPATH=DIR (a source tree's src; the default sides run the tree this process imports), measured "
        "in the same alternating rounds against the same engine; their sides are named POLICY@NAME (an A/B "
        "of two trees in one run)",
    )
    args = ap.parse_args()
    if args.palindromes < 1:
        ap.error(f"--palindromes {args.palindromes}: must be 1 or more")
    trees: dict[str, str] = {}
    for item in (t.strip() for t in args.usg_src.split(",") if t.strip()):
        name, eq, path = item.partition("=")
        if not eq or not name or "@" in name or name in trees or not (Path(path) / "usg").is_dir():
            ap.error(f"--usg-src: {item!r} must be NAME=DIR, each NAME once, DIR a source tree's src (DIR/usg)")
        trees[name] = str(Path(path).resolve())
    args.proxy_policy = [p.strip() for p in args.proxy_policy.split(",") if p.strip()]
    for p in args.proxy_policy:
        if p not in PROXY_POLICIES:
            ap.error(
                f"--proxy-policy: {p!r} is not a CPU policy; use one or more of {', '.join(PROXY_POLICIES)}, "
                "comma-separated (e.g. normal,batch)"
            )
    if not args.proxy_policy or len(set(args.proxy_policy)) != len(args.proxy_policy):
        ap.error("--proxy-policy: name each policy once (e.g. normal,batch)")
    args.usg_src = trees
    args.proxy_policy += [f"{p}@{name}" for name in trees for p in args.proxy_policy]
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
        for policy, heads in report(result, args).items():
            summary.append((f"{placement}/{policy}", heads))
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
