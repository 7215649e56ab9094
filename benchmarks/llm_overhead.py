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

Prints p50s, USG's added milliseconds (targets: ≤ 3 ms p50 on latency and on time to first
token), the ``usg serve`` process's CPU time per question, and the throughput ratios (target
≥ 0.95×). Greedy decoding: both paths generate the
same tokens. Run: ``python benchmarks/llm_overhead.py`` (needs ``usg[llm-engine]``, torch).
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


def _cpu_s(pid: int) -> float:
    """CPU time process ``pid`` has used so far (Linux ``/proc``): the scheduler's nanosecond
    run time of its threads (``schedstat``), else user + system in clock ticks (10 ms each,
    0.25 ms a question over 40 questions: too coarse for the figure)."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        help="torch intra-op threads of the engine (default: one per core, sharing them with usg serve)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llm-overhead-"))
    print("building the tiny model and starting transformers serve ...", flush=True)
    engine = start_engine(build_tiny_llama(tmp / "model"), tmp / "engine.log", threads=args.engine_threads)
    usg_server = bare = None
    try:
        eurl = f"http://127.0.0.1:{engine.port}"
        model = httpx.get(f"{eurl}/v1/models").json()["data"][0]["id"]
        graph = tmp / "graph.yaml"
        graph.write_text(GRAPH.format(url=eurl, model=model, max_tokens=args.max_tokens, inflight=args.clients))
        usg_server = start_server(graph, "--max-inflight", str(max(64, args.clients * 2)), tmp=tmp)
        uurl = usg_server.url
        bare = _start_bare(eurl, model, args.max_tokens, args.clients, tmp / "bare.log")
        burl = f"http://127.0.0.1:{bare.port}"
        plain, streamed = (_direct_body(model, args.max_tokens, QUESTION, s) for s in (False, True))
        with httpx.Client(timeout=300) as client:
            for _ in range(3):  # warm both paths (first generation, connections)
                _direct(client, eurl, plain)
                _direct(client, eurl, streamed)
                _usg(client, uurl, QUESTION, stream=False)
                _usg(client, uurl, QUESTION, stream=True)
                client.post(f"{burl}/v1/infer", json={"inputs": {"question": QUESTION}}).raise_for_status()
            print(f"latency: {args.requests} text-only questions per side, alternating ...", flush=True)
            cpu0 = _cpu_s(usg_server.proc.pid)
            d_lat, u_lat = _alternate(
                args.requests, lambda: _direct(client, eurl, plain), lambda: _usg(client, uurl, QUESTION, False)
            )
            usg_cpu_ms = (_cpu_s(usg_server.proc.pid) - cpu0) / args.requests * 1e3
            print(f"time to first token: {args.requests} streamed questions per side ...", flush=True)
            cpu0 = _cpu_s(usg_server.proc.pid)
            d_tt, u_tt = _alternate(
                args.requests, lambda: _direct(client, eurl, streamed), lambda: _usg(client, uurl, QUESTION, True)
            )
            usg_cpu_stream_ms = (_cpu_s(usg_server.proc.pid) - cpu0) / args.requests * 1e3

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
        pids = {"usg": usg_server.proc.pid, "bare": bare.proc.pid}
        for stream in (False, True):
            order = ("direct", "usg", "usg", "direct") if stream else ("direct", "usg", "bare", "bare", "usg", "direct")
            print(
                f"throughput{' (streamed)' if stream else ''}: {args.clients} concurrent clients x "
                f"{args.per_client} questions per side and round, 2 rounds ({', '.join(order)}) ...",
                flush=True,
            )
            totals = {side: [0, 0.0, 0.0] for side in order}
            for side in order:
                cpu0 = _cpu_s(pids[side]) if side in pids else 0.0
                done, secs = asyncio.run(_throughput(args.clients, args.per_client, sender(side, stream)))
                totals[side][0] += done
                totals[side][1] += secs
                totals[side][2] += _cpu_s(pids[side]) - cpu0 if side in pids else 0.0
            rps[stream] = {side: done / secs for side, (done, secs, _) in totals.items()}
            if not stream:
                load_cpu = {side: cpu / done * 1e3 for side, (done, _, cpu) in totals.items() if side in pids}
        n = int(totals["usg"][0])
    finally:
        for proc in (usg_server, bare):
            if proc is not None:
                proc.stop()
        engine.stop()

    lat_d, lat_u = _p50_ms([t for t, _ in d_lat]), _p50_ms([t for t, _ in u_lat])
    tt_d, tt_u = _p50_ms([f for _, f in d_tt]), _p50_ms([f for _, f in u_tt])
    paired = statistics.median([(u[0] - d[0]) * 1e3 for d, u in zip(d_lat, u_lat, strict=True)])
    paired_tt = statistics.median([(u[1] - d[1]) * 1e3 for d, u in zip(d_tt, u_tt, strict=True)])
    own = _p50_ms([o for _, o in u_lat])
    print()
    print(f"{'measure':<38}{'direct':>10}{'via USG':>10}{'added':>10}{'target':>10}")
    print(
        f"{'p50 latency, text-only question (ms)':<38}{lat_d:>10.1f}{lat_u:>10.1f}{lat_u - lat_d:>+10.1f}{'<= 3':>10}"
    )
    print(f"{'p50 time to first token (ms)':<38}{tt_d:>10.1f}{tt_u:>10.1f}{tt_u - tt_d:>+10.1f}{'<= 3':>10}")
    print(f"{'median paired difference, latency (ms)':<38}{'':>10}{'':>10}{paired:>+10.1f}")
    print(f"{'median paired difference, TTFT (ms)':<38}{'':>10}{'':>10}{paired_tt:>+10.1f}")
    print(f"{'p50 USG time outside the engine call':<38}{'':>10}{'':>10}{own:>+10.1f}{'<= 3':>10}")
    print(f"{'usg serve CPU per question (ms)':<38}{'':>10}{usg_cpu_ms:>10.2f}")
    print(f"{'usg serve CPU per streamed question':<38}{'':>10}{usg_cpu_stream_ms:>10.2f}")
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
    threads = args.engine_threads or "one per core"
    print(f"({n} questions per side; max_tokens {args.max_tokens}; engine: transformers serve, CPU, threads {threads})")
    print(
        "USG time outside the engine call = client-observed total - the LLM node's node_ms (HTTP in and out, "
        "prompt node, JSON); unlike the A/B difference it does not carry the engine's run-to-run variance; "
        "usg serve CPU = the server process's run time over the latency phase (streamed: the TTFT phase), per "
        "question (everything USG does, its own engine client included; the least load-sensitive figure); the "
        "bare proxy (benchmarks/bare_llm_proxy.py): uvicorn + USG's engine client, no graph, limits or metrics — "
        "what any process between the clients and a CPU engine on the same cores costs"
    )


if __name__ == "__main__":
    main()
