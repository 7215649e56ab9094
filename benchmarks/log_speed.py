"""How fast does `usg doctor logs` read a long server log? Lines/s with the rules' literal pre-check against
every rule run on every line (the code before it), in the same run.

The log is generated: ``--lines`` records cycling through Triton start-up, vLLM engine and uvicorn access
lines with timestamps and changing numbers (what fills a real server log), plus a warning every 5 000
lines and, in the middle, a traceback ending in a CUDA out-of-memory error. Both variants must give the
same findings. Then the whole CLI (``usg doctor logs FILE``, start-up and the learned layer's index
included) runs once on the log and once on a log of one long line (``--long-line-mb`` of escaped JSON
with the error at its end): wall time and peak memory of the process.

Run: python benchmarks/log_speed.py [--lines 200000] [--long-line-mb 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import usg.doctor.logs.classify as classify
from usg.doctor.logs.rules import RULES

RECORDS = (
    "I1206 04:{m:02d}:{s:02d}.{u:06d} 1 model_lifecycle.cc:{n}] loading: model_{k}:1",
    "I1206 04:{m:02d}:{s:02d}.{u:06d} 1 onnxruntime.cc:{n}] TRITONBACKEND_ModelInstanceInitialize: model_{k}_0 (CPU "
    "device 0)",
    "INFO 12-06 04:{m:02d}:{s:02d} metrics.py:{n}] Avg prompt throughput: {k}.4 tokens/s, Avg generation throughput: "
    "{n}.1 tokens/s, Running: {k} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 12.{k}%",
    'INFO:     127.0.0.1:{n} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "INFO 12-06 04:{m:02d}:{s:02d} engine.py:{n}] Added request chatcmpl-{u}{k}.",
    "DEBUG 12-06 04:{m:02d}:{s:02d} scheduler.py:{n}] batch of {k} sequences, {u} tokens",
)
WARNING = "W1206 04:{m:02d}:{s:02d}.{u:06d} 1 pinned_memory_manager.cc:{n}] Unable to allocate pinned system memory"
TRACEBACK = [
    "ERROR 12-06 04:30:00 engine.py:157] Error in model execution",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/vllm/worker/model_runner.py", line 1450, in execute_model',
    "    hidden_states = model_executable(input_ids=input_ids)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 "
    "GiB of which 1.20 GiB is free.",
]


def make_log(n: int) -> str:
    lines = []
    for i in range(n):
        values = {"m": i // 3600 % 60, "s": i % 60, "u": (i * 7919) % 1_000_000, "n": 100 + i % 900, "k": i % 97}
        lines.append((WARNING if i % 5000 == 4999 else RECORDS[i % len(RECORDS)]).format(**values))
        if i == n // 2:
            lines.extend(TRACEBACK)
    return "\n".join(lines)


class _EveryRule:
    """The gate switched off: every rule is a candidate for every line."""

    def candidates(self, folded: str) -> list[int]:
        return list(range(len(RULES)))


def _plain_screen(pattern: Any, text: str, folded: str) -> bool:
    return pattern.search(text) is not None


def timed(text: str, index: Any, gated: bool) -> tuple[float, list[tuple[str, int | None]]]:
    saved = classify._GATE, classify.screen
    if not gated:
        classify._GATE, classify.screen = _EveryRule(), _plain_screen  # type: ignore[assignment]
    try:
        t0 = time.process_time()
        findings = classify.classify_text(text, index=index)
        cpu = time.process_time() - t0
    finally:
        classify._GATE, classify.screen = saved
    return cpu, [(f.code, f.location.line) for f in findings]


_MEASURE = (
    "import resource, subprocess, sys, time; t0 = time.perf_counter(); "
    "subprocess.run(sys.argv[1:], capture_output=True); "
    "print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def cli(path: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `usg doctor logs PATH` in a fresh process (measured by a parent
    of its own, so that each run's peak is its own)."""
    cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "usg", "doctor", "logs", str(path)]
    wall, peak_kib = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    return float(wall), int(peak_kib) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--long-line-mb", type=float, default=20.0)
    args = ap.parse_args()
    text = make_log(args.lines)
    n = text.count("\n") + 1
    index = classify.default_index()
    timed(text[:200_000], index, True)  # warm-up: caches, the rules' literals
    gated_cpu, gated = timed(text, index, True)
    every_cpu, every = timed(text, index, False)
    print(f"log of {n} lines ({len(text) / 2**20:.1f} MiB), {len(gated)} findings")
    for label, cpu in (("with the pre-check:  ", gated_cpu), ("every rule each line:", every_cpu)):
        print(f"  {label} {cpu:6.2f} s CPU, {n / cpu:9.0f} lines/s, {cpu / n * 1e6:6.1f} us/line")
    print(f"  speed-up {every_cpu / gated_cpu:.1f}x; same findings: {gated == every}")
    if gated != every:
        raise SystemExit(f"findings differ: {gated} vs {every}")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        log.write_text(text)
        wall, peak = cli(log)
        print(f"usg doctor logs on it: {wall:.1f} s wall, peak RSS {peak:.0f} MiB")
        one = Path(tmp) / "one.log"
        one.write_text(TRACEBACK[-1])
        wall, _ = cli(one)
        print(f"usg doctor logs on a one-line log (start-up, index): {wall:.1f} s wall")
        long = Path(tmp) / "long.log"
        chars = int(args.long_line_mb * 2**20)
        long.write_text('{"log": "' + "\\n".join(["step ok"] * (chars // 9)) + "\\n" + TRACEBACK[-1] + '"}')
        wall, peak = cli(long)
        print(f"usg doctor logs on one {args.long_line_mb:g} MiB line: {wall:.1f} s wall, peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
