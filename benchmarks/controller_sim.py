"""Issue #21: the batch controller on simulated rec calls, no model and no wall clock: how fast a
fresh controller leaves the declared cap, and how often it probes once settled.

The cost model is PP-OCRv4 rec's CPU per item by cap measured on the document graph in session 7
(1: 49 ms, 2: 53, 4: 60, 8: 67; the graph declares max_size 8, the cheapest is 1), each call's
time swinging uniformly by +-NOISE. Printed per noise level, means over --seeds runs:

  start     calls until the settled cap is 1 for good (a saturated queue, calls of the cap)
  extra@N   CPU per item over the first N items above what cap 1 all along would have cost
  probes    probes per run over 3,000 calls of 1-4 queued items whose events arrive one call
            late (two calls in flight), per-item 48/53/62/70 ms at 1/2/3/4 items, +-40%
  flipping  runs among those whose settled cap changed more than once after the first quarter
  at-1      share of the second half's calls made at cap 1

Run the same script against two source trees to compare controllers:
  PYTHONPATH=/work/main/src python benchmarks/controller_sim.py
  PYTHONPATH=src python benchmarks/controller_sim.py
"""

from __future__ import annotations

import argparse
import random
import re
import statistics

from usg.graph import BatchPolicy
from usg.records import BatchEvent
from usg.runtime.controller import BatchController

REC = {1: 49.0, 2: 53.0, 4: 60.0, 8: 67.0}
LATE = {1: 48.0, 2: 53.0, 3: 62.0, 4: 70.0}
POLICY = BatchPolicy(max_size=8, max_delay_ms=3, adaptive=True)


def start(seed: int, noise: float, marks: tuple[int, ...]) -> tuple[int, dict[int, float]]:
    ctl = BatchController("rec", POLICY, history=10_000)
    rng = random.Random(seed)
    extra = 0.0
    items = 0
    settled: list[int] = []
    extra_at: dict[int, float] = {}
    for _ in range(1600):
        ctl.formed(16)
        n = ctl.cap
        ms = REC[n] * n * (1 + rng.uniform(-noise, noise))
        extra += n * (REC[n] - REC[1])
        items += n
        ctl.observe(BatchEvent("rec", n, n, 0, 0, (0.0,) * n, ms, True, cpu_ms=ms))
        settled.append(ctl.settled_cap)
        for m in marks:
            if m not in extra_at and items >= m:
                extra_at[m] = extra / items / REC[1]
    last = max((i for i, c in enumerate(settled) if c != 1), default=-1) + 1
    return last, extra_at


def late_events(seed: int) -> tuple[int, int, float]:
    now = [0.0]
    ctl = BatchController("rec", POLICY, history=10_000, clock=lambda: now[0])
    rng = random.Random(seed)
    late: list[BatchEvent] = []
    at_one = total = 0
    for k in range(3000):
        ctl.formed(4)
        n = min(ctl.cap, rng.choice((1, 2, 3, 4)))
        if k >= 1500:
            at_one += ctl.cap == 1
            total += 1
        ms = LATE[n] * n * (1 + rng.uniform(-0.4, 0.4))
        now[0] += ms / 2e3
        late.append(BatchEvent("rec", n, n, 0, 0, (0.0,) * n, ms, True))
        if len(late) > 1:
            ctl.observe(late.pop(0))
    probes = sum(1 for d in ctl.decisions if re.match(r"probe \d", d.reason))
    kept = ("probe lost", "probe abandoned", "start")
    moves = [d for d in ctl.decisions if not re.match(r"probe \d", d.reason) and not d.reason.startswith(kept)]
    return probes, sum(1 for d in moves if d.time > now[0] / 4), at_one / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    marks = (100, 400, 1600)
    print(f"{'noise':>6}{'start (calls)':>15}" + "".join(f"{'extra@' + str(m):>12}" for m in marks))
    for noise in (0.1, 0.3, 0.5):
        runs = [start(s, noise, marks) for s in range(args.seeds)]
        calls = statistics.mean(r[0] for r in runs)
        extra = [statistics.mean(r[1].get(m, float("nan")) for r in runs) for m in marks]
        print(f"{noise:>6.1f}{calls:>15.1f}" + "".join(f"{100 * e:>11.1f}%" for e in extra))
    late = [late_events(s) for s in range(args.seeds)]
    print(
        f"late events, +-40%: probes per run {statistics.mean(r[0] for r in late):.1f}, "
        f"runs flipping {sum(1 for r in late if r[1] > 1)}/{len(late)}, "
        f"at-1 {100 * statistics.mean(r[2] for r in late):.1f}%"
    )


if __name__ == "__main__":
    main()
