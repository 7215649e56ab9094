"""Placements of ``benchmarks/llm_overhead.py`` and the ``/proc`` readings that prove them.

A placement is where the engine, the proxies and the clients may run and how the engine's torch
threads are set. Each is checked from ``/proc`` while it runs, not trusted: the CPU affinity of
every thread of every process (``Cpus_allowed_list``), the engine's OpenMP settings in its
environment (``/proc/PID/environ``), and how many of the engine's threads actually run (the
scheduler's run time of each thread, ``/proc/PID/task/TID/schedstat``).

How the engine picks its threads: ``transformers serve`` (without ``--continuous-batching``) runs
each ``model.generate`` on one inference thread and never sets torch's thread count; torch's
intra-op pool is OpenMP (the libgomp bundled with the torch wheel; MKL uses the same runtime), sized
by ``OMP_NUM_THREADS`` or else one thread per core. libgomp's idle workers spin before they sleep
unless ``OMP_WAIT_POLICY=PASSIVE``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# the engine's environment variables the placements set, and what the checks read back
OMP_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")


@dataclass(frozen=True)
class Placement:
    name: str
    pinned: bool  # engine on --engine-cpus, everything else on the other cores
    threads: int | None  # OMP_NUM_THREADS of the engine (None: --engine-threads, else torch's choice)
    wait_policy: str | None  # OMP_WAIT_POLICY of the engine (None: unset, libgomp spins then sleeps)
    title: str


PLACEMENTS = {
    p.name: p
    for p in (
        Placement("shared", False, None, None, "no pinning; engine torch threads: torch's choice (one per core)"),
        Placement("shared1", False, 1, None, "no pinning; engine with ONE torch thread (OMP_NUM_THREADS=1)"),
        Placement(
            "shared-passive",
            False,
            None,
            "PASSIVE",
            "no pinning; engine torch threads: torch's choice, OMP_WAIT_POLICY=PASSIVE (idle threads sleep)",
        ),
        Placement("split", True, None, None, "engine pinned to its own core(s), torch threads = those cores"),
    )
}


def engine_env(placement: Placement, engine_threads: int | None, engine_cpus: set[int]) -> dict[str, str | None]:
    """The OpenMP variables the engine of ``placement`` must have (None: must be unset)."""
    threads = placement.threads
    if placement.pinned:
        threads = len(engine_cpus)
    elif threads is None:
        threads = engine_threads
    return {"OMP_NUM_THREADS": None if threads is None else str(threads), "OMP_WAIT_POLICY": placement.wait_policy}


def cpu_list(text: str) -> set[int]:
    """``"0-1,3"`` → ``{0, 1, 3}`` (the format of ``Cpus_allowed_list`` and ``--engine-cpus``)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def fmt_cpus(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of ``pid`` (``sched_setaffinity`` acts on one thread;
    threads and processes started later inherit their creator's)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def spawning_on(cpus: set[int] | None) -> Iterator[None]:
    """Processes started inside run on ``cpus`` (they inherit this thread's affinity); this thread's
    own affinity is restored after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_s(pid: int) -> float:
    """CPU time process ``pid`` has used so far (Linux ``/proc``): the scheduler's nanosecond
    run time of its threads (``schedstat``), else user + system in clock ticks (10 ms each,
    0.25 ms a question over 40 questions: too coarse for the figure)."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """Per thread of ``pid``: its run time so far in seconds (``schedstat``)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
    return out


def busy_threads(before: dict[int, float], after: dict[int, float], secs: float) -> list[float]:
    """Each thread's share of one core between two ``thread_cpu_s`` readings ``secs`` apart, largest
    first (threads that started in between count from zero)."""
    return sorted(((t - before.get(tid, 0.0)) / secs for tid, t in after.items()), reverse=True)


def descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (from ``/proc/*/stat``'s parent ids)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _allowed(pid: int) -> tuple[int, set[str]]:
    """(threads, the distinct ``Cpus_allowed_list`` values of those threads) of process ``pid``."""
    lists: set[str] = set()
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    lists.add(line.split(":", 1)[1].strip())
                    n += 1
    return n, lists


def check_pinning(when: str, procs: dict[str, int], expected: dict[str, set[int]]) -> list[str]:
    """Read ``Cpus_allowed_list`` of every thread of every process in ``procs`` (and of their child
    processes); one line each; exit if any thread may run outside its expected cores."""
    lines, wrong = [], []
    for name, pid in procs.items():
        for p in [pid, *(k for k in descendants(pid) if k not in procs.values())]:
            threads, lists = _allowed(p)
            ok = all(cpu_list(x) == expected[name] for x in lists)
            label = name if p == pid else f"{name} child {p}"
            lines.append(
                f"  {when}: {label:<22} pid {p:>7}  {threads:>3} threads  Cpus_allowed_list "
                f"{' | '.join(sorted(lists))}  (expected {fmt_cpus(expected[name])}) {'ok' if ok else 'WRONG'}"
            )
            if not ok:
                wrong.append(label)
    print("\n".join(lines), flush=True)
    if wrong:
        raise SystemExit(f"pinning did not hold for {', '.join(wrong)}: see the Cpus_allowed_list lines above")
    return lines


def check_engine_env(pid: int, expected: dict[str, str | None]) -> str:
    """Read the engine's OpenMP variables from ``/proc/PID/environ``; one line; exit if one differs
    from what the placement set (an OMP variable inherited from the caller's shell, say)."""
    env: dict[str, str] = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    got = {k: env.get(k) for k in expected}
    line = "  engine environment: " + "  ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in got.items())
    print(line, flush=True)
    wrong = [k for k in expected if got[k] != expected[k]]
    if wrong:
        raise SystemExit(
            f"the engine's {', '.join(wrong)} is {[got[k] for k in wrong]}, the placement sets "
            f"{[expected[k] for k in wrong]} (None: unset): unset {', '.join(wrong)} in the shell that runs "
            "the benchmark"
        )
    return line


def core_ticks() -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) clock ticks since boot (``/proc/stat``; idle and iowait are not busy)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields[:8]]
            out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return out


def ctxt_switches(pid: int) -> dict[int, tuple[int, int]]:
    """Per thread of ``pid``: (voluntary, nonvoluntary) context switches so far (``/proc/PID/task/TID/
    status``). A nonvoluntary one is the thread taken off its core while it could run: preempted by a
    woken thread, or its time slice over."""
    out: dict[int, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
            out[int(task.name)] = (int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"]))
    return out


def run_delay_s(pid: int) -> float:
    """Time the threads of ``pid`` have spent runnable but waiting for a core so far, seconds
    (``schedstat``'s second field): what a lower scheduling class costs the process."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


# CPU policies of the proxies (``--proxy-policy``): name → (scheduling policy, nice); applied from outside to
# every thread of a proxy process right after it starts (threads it starts later inherit them)
PROXY_POLICIES: dict[str, tuple[str, int]] = {
    "normal": ("SCHED_OTHER", 0),
    "batch": ("SCHED_BATCH", 0),  # a woken thread does not preempt the running one
    "nice10": ("SCHED_OTHER", 10),
    "nice19": ("SCHED_OTHER", 19),
    "idle": ("SCHED_IDLE", 0),
}
_POLICY_NAMES = {0: "SCHED_OTHER", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def set_proxy_policy(pid: int, name: str) -> None:
    """Put every thread of ``pid`` under proxy CPU policy ``name`` (``sched_setscheduler`` and
    ``setpriority`` act on one thread)."""
    policy, nice = PROXY_POLICIES[name]
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(int(task.name), getattr(os, policy), os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def read_proxy_policy(pid: int) -> list[tuple[str, int]]:
    """(scheduling policy, nice) of every thread of ``pid``, read back from the kernel."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            tid = int(task.name)
            policy = os.sched_getscheduler(tid)
            out.append((_POLICY_NAMES.get(policy, str(policy)), os.getpriority(os.PRIO_PROCESS, tid)))
    return out
