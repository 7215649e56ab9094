"""The dynamic batch controller: per model, the batch cap and the wait adapt to measured cost.

Opt-in per model (``batch: {adaptive: true}``). The declared ``max_size`` / ``max_delay_ms``
are the starting point and the upper bounds; the controller only ever lowers them, and
raises them back toward the declared values when that pays.

Cost. Every successful backend call (a :class:`~usg.records.BatchEvent`) gives a per-item
cost, ``compute_ms / items``. Calls are binned by their size onto the candidate caps (powers
of two below ``max_size``, and ``max_size``; ``preferred_sizes`` when declared): a call of
``n`` items counts for the smallest candidate ``>= n``. Each bin keeps the plain mean of its
first ``1 / alpha`` calls, then an exponentially weighted mean, so it follows a cost that
changes (and a freshly probed bin is not dominated by its first call).

Hill climbing with hysteresis. Every ``window`` calls the controller compares the current
cap's bin with the others measured in that window and moves only when one is at least
``hysteresis`` cheaper per item, and by more than three times the noise of the two means
(each bin also keeps a weighted variance; on a shared CPU call times swing 2x). Back to a cap
the settled cap left within ``recent_windows`` windows takes twice the hysteresis, and a bin
counts as measured in a window only with two calls or more, none of them formed before the
cap last changed (with two calls in flight, one formed at the old cap ends after the change):
so two caps whose costs are close do not take turns. A cap it has not measured just now is
*probed*: the cap moves there for one window (up to three while it is cheaper by the hysteresis
but not yet by three times the noise), and the next decision keeps it or goes back — a smaller
cap still cheaper by the hysteresis after those windows is kept even within the noise (the same
cost at a smaller cap is lower latency; rec at its declared 8 read 26% dearer than at 1 on a noisy
host, not beyond three times the noise of three 4-call windows, and stayed at 8 for 28 s) —
a smaller cap that occasional smaller calls showed cheaper first (rec at cap 4 with a call of
1 now and then goes to 1 without a stop at 2), else the neighbour measured longest ago.
A probe that confirms the current cap doubles the time to the next probe (up to
``max_probe_gap`` windows), so under steady load the cap stays put and probes become rare. A cap
that lost a probe, dearer per item than the current one by a fraction ``e``, *rests*: it is not
probed again for ``e / probe_budget`` windows per window's worth of items run at it (up to
``max_probe_gap``), so lost probes cost about ``probe_budget`` (2%) of the model's compute at
most: rec on the document graph lost each probe of 2 by 20-40%, and with the doubling gap alone
spent a quarter of a 50 s round at cap 2. (A cap just left does not rest: the move may have
followed noise, and going back must stay possible.) And a cap measured within
``max_probe_gap`` windows at more than 1.5x the current per-item cost
(``probe_margin``) is not probed again until that measurement is older;
a move resets the gap, and the current bin's cost drifting from what it was when the cap settled
(by more than the hysteresis and three times the noise of a difference of two means) halves it
(and what is left of each rest):
that is how it reacts to a change in cost, while noise that now and then crosses the band does
not keep the gap short. A larger cap
is probed only when the queue held enough items to fill it.

Start. A fresh controller decides every ``start_window`` (4) calls instead of every ``window``,
and probes each smaller cap once, one after the other (a smaller cap that calls showed cheaper
first, else the smallest), each from a home window that re-measures the current cap: a lost probe
does not lengthen the gap while some smaller cap is unprobed, and caps measured far worse are
probed anyway (a cap's first calls include those of the warm-up, whose costs are not yet the
steady ones). When no smaller cap is left unprobed the windows become ``window`` calls. A whole
server round builds a fresh executor: on the document graph, rec's calls at the declared cap 8
come at about one a second, so 12-call windows kept the declared cap for 10-20 s.

Latency. With ``target_p95_ms`` the p95 of (queue wait + call time) over the window is kept
under the target: above it the wait halves, then the cap steps down (and is not raised again
by cost until the p95 is below half the target). At cap 1 the wait is 0 (nothing to wait for).

Every decision is recorded, with its time and reason, in a bounded deque (``decisions``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from usg.graph.model import BatchPolicy
from usg.records import BatchEvent

__all__ = ["BatchController", "Decision"]


@dataclass(frozen=True)
class Decision:
    """One change of a controller's setting (or a probe), with why."""

    time: float
    cap: int
    wait_ms: float
    reason: str


@dataclass
class _Bin:
    cost: float | None = None  # per-item compute, ms: the running mean, then an EWMA
    var: float = 0.0  # the same weighting of the squared deviation from it
    samples: int = 0
    window: int = 0  # the decision window of the last sample
    in_window: int = 0  # samples in that window

    def add(self, per_item_ms: float, alpha: float, window: int) -> None:
        self.samples += 1
        self.in_window = self.in_window + 1 if window == self.window else 1
        self.window = window
        if self.cost is None:
            self.cost = per_item_ms
            return
        # the plain mean of the first 1/alpha samples, then the EWMA: a fresh bin (a probe's) is
        # not dominated by its first call, as an EWMA seeded with it would be (0.75^3 = 42% of
        # the mean after 4 calls at alpha 0.25)
        a = max(alpha, 1.0 / self.samples)
        dev = per_item_ms - self.cost
        self.cost += a * dev
        self.var = (1 - a) * (self.var + a * dev * dev)

    def stderr(self, alpha: float) -> float:
        """Standard error of the mean (an EWMA averages about (2 - alpha) / alpha samples)."""
        if self.samples < 2:
            return math.inf  # one call says nothing about the noise
        n = min(float(self.samples), (2 - alpha) / alpha)
        return math.sqrt(self.var * n / (n - 1) / n) if n > 1 else math.inf


def candidate_sizes(policy: BatchPolicy) -> tuple[int, ...]:
    """The caps the controller may choose: preferred sizes, else powers of two below max_size and max_size."""
    if policy.preferred_sizes:
        sizes = set(policy.preferred_sizes) | {1}
    else:
        sizes = {1 << k for k in range(max(1, policy.max_size).bit_length()) if (1 << k) < policy.max_size}
    sizes.add(max(1, policy.max_size))
    return tuple(sorted(s for s in sizes if 1 <= s <= max(1, policy.max_size)))


class BatchController:
    """Chooses one model's batch cap and wait from the calls it is shown; see the module docstring."""

    def __init__(
        self,
        model: str,
        policy: BatchPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        window: int = 12,
        start_window: int = 4,
        min_samples: int = 4,
        hysteresis: float = 0.05,
        alpha: float = 0.25,
        max_probe_gap: int = 64,
        probe_margin: float = 0.5,
        probe_budget: float = 0.02,
        stale_windows: int = 32,
        recent_windows: int = 16,
        history: int = 256,
    ) -> None:
        self.model = model
        self.policy = policy
        self.sizes = candidate_sizes(policy)
        self.clock = clock
        self.window = max(1, window)
        self.start_window = max(1, min(start_window, self.window))
        self.min_samples = max(1, min_samples)
        self.hysteresis = hysteresis
        self.alpha = alpha
        self.max_probe_gap = max(1, max_probe_gap)
        self.probe_margin = probe_margin
        self.probe_budget = probe_budget
        self.stale_windows = stale_windows
        self.recent_windows = recent_windows
        self.target_p95_ms = policy.target_p95_ms
        self.decisions: deque[Decision] = deque(maxlen=history)
        self._i = len(self.sizes) - 1  # start from the declared max_size
        self._ceiling = self._i  # latency ceiling (index)
        self._wait_ms = float(policy.max_delay_ms)
        self._bins = [_Bin() for _ in self.sizes]
        self._events = 0
        self._windows = 0
        self._latencies: list[float] = []
        self._max_depth = 0
        self._probe_from: int | None = None  # index to return to if a probe loses
        self._probe_windows = 0  # decision windows the current probe has run
        self._probe_gap = 1
        self._next_probe = 1  # window number of the next allowed probe
        self._settled_cost: float | None = None
        self._left: dict[int, int] = {}  # cap index -> the window the settled cap last left it
        self._probed: dict[int, int] = {}  # cap index -> the window it was last probed
        self._rest: dict[int, int] = {}  # cap index -> the first window it may be probed again
        self._changed = -1  # the window in which the cap last changed (a move, a probe, its end)
        self._item_elements: float | None = None  # mean input elements per item (EWMA)
        self._starting = True  # short windows, each smaller cap probed once (the module docstring's "Start")
        self._record("start: declared values")

    # -- what the batcher asks -----------------------------------------------------------
    @property
    def cap(self) -> int:
        return self.sizes[self._i]

    @property
    def wait_ms(self) -> float:
        return 0.0 if self.cap == 1 else self._wait_ms

    @property
    def settled_cap(self) -> int:
        """The cap without a probe in progress (the one a probe returns to if it loses)."""
        return self.sizes[self._probe_from if self._probe_from is not None else self._i]

    def formed(self, queue_depth: int) -> None:
        """The batcher is forming a batch with ``queue_depth`` items waiting (demand for a bigger cap)."""
        self._max_depth = max(self._max_depth, queue_depth)

    # -- what the batcher tells it ---------------------------------------------------------
    def observe(self, event: BatchEvent) -> None:
        if not event.ok or event.items < 1:
            return
        b = self._bin_of(event.items)
        self._bins[b].add(self._unit_cost(event), self.alpha, self._windows)
        self._latencies.extend(q + event.compute_ms for q in event.queue_ms)
        self._events += 1
        if self._events >= (self.start_window if self._starting else self.window):
            self._decide()

    @property
    def starting(self) -> bool:
        """Whether the start sweep (short windows, every smaller cap probed once) is still on."""
        return self._starting

    def _unit_cost(self, event: BatchEvent) -> float:
        """The call's cost per item (CPU ms when the backend reports it, else wall ms), per
        input element when the items carry arrays, so calls of wide and narrow items compare."""
        ms = event.cpu_ms if event.cpu_ms is not None else event.compute_ms
        if event.real_elements <= 0:
            return ms / event.items
        per_item = event.real_elements / event.items
        self._item_elements = per_item if self._item_elements is None else 0.9 * self._item_elements + 0.1 * per_item
        return ms / event.real_elements

    def cost_ms(self, cap: int) -> float | None:
        """The measured cost per item (of the mean size seen) at ``cap``; None if not measured."""
        if cap not in self.sizes or self._bins[self.sizes.index(cap)].cost is None:
            return None
        cost = self._bins[self.sizes.index(cap)].cost
        assert cost is not None
        return cost * (self._item_elements or 1.0)

    def _ms(self, unit_cost: float) -> str:
        return f"{unit_cost * (self._item_elements or 1.0):.3g} ms"

    # -- deciding --------------------------------------------------------------------------
    def _bin_of(self, n: int) -> int:
        for i, s in enumerate(self.sizes):
            if n <= s:
                return i
        return len(self.sizes) - 1

    def _known(self, i: int, max_age: int | None = None) -> float | None:
        """Bin ``i``'s per-item cost, if measured enough and within ``max_age`` windows."""
        b = self._bins[i]
        age = self.stale_windows if max_age is None else max_age
        if b.cost is None or b.samples < self.min_samples or self._windows - b.window > age:
            return None
        return b.cost

    def _cheaper(self, j: int, i: int) -> bool:
        """Bin j's per-item cost is below bin i's by the hysteresis and by twice the noise of both;
        by twice the hysteresis when the settled cap left j within ``recent_windows`` (going back
        to a cap just left needs more evidence than leaving it did: no flipping between two caps
        whose costs are close)."""
        a, b = self._bins[j], self._bins[i]
        if a.cost is None or b.cost is None:
            return False
        noise = 3 * math.hypot(a.stderr(self.alpha), b.stderr(self.alpha))
        return a.cost < b.cost * (1 - self._margin(j)) and b.cost - a.cost > noise

    def _margin(self, j: int) -> float:
        """The hysteresis for a move to cap ``j``: twice it when the settled cap left ``j`` within
        ``recent_windows`` windows."""
        left = self._left.get(j)
        return self.hysteresis * (2 if left is not None and self._windows - left <= self.recent_windows else 1)

    def _fresh(self, i: int) -> float | None:
        """Bin ``i``'s per-item cost if it was measured just now: at least two calls (not one
        straggler, a call formed at the old cap that ended after a change) in the window that
        ended, and none of that window's calls formed before the last change of the cap."""
        b = self._bins[i]
        if b.window != self._windows - 1 or b.in_window < 2 or self._changed >= self._windows - 1:
            return None
        return self._known(i, max_age=1)

    def _decide(self) -> None:
        self._windows += 1
        latencies, self._latencies, self._events = self._latencies, [], 0
        depth, self._max_depth = self._max_depth, 0
        if self.target_p95_ms is not None and latencies and self._latency(latencies):
            return
        if self._probe_from is not None:
            self._end_probe()
            return
        here = self._known(self._i)
        if here is None:
            # calls do not reach this cap (the queue never holds that many): lowering it to the
            # largest size they reach changes no call, and lets the next decisions compare and probe
            # from there (at cap 8 with calls of 3-4 items, cap 4 against 2 and 1)
            reached = [j for j in range(self._i) if self._known(j, max_age=1) is not None]
            if reached:
                j = max(reached)
                self._move(j, f"calls reach {self.sizes[j]} items at most: cap {self.cap} -> {self.sizes[j]}")
            return
        drift = abs(here - self._settled_cost) if self._settled_cost is not None else 0.0
        # three times the noise of the difference of two such means (the settled cost was one too):
        # at twice one mean's noise, rec's +-10% calls "drifted" every ~5 windows and re-opened
        # probing of 2 each time (a third of the items ran at 2 in simulation)
        noise = 3 * math.sqrt(2) * self._bins[self._i].stderr(self.alpha)
        if self._settled_cost is not None and drift > max(self.hysteresis * self._settled_cost, noise):
            # the gap halves (it was reset to one window): a window's mean past the band is most
            # often noise, and becoming the settled cost it anchors the next test at an extreme, so
            # drifts recur; rec settled at 1 on the document graph re-opened its probes of 2 every
            # ~3 s and the gap never grew (in simulation: probes per run 18 -> 12, items at the
            # cheapest cap 91% -> 94%); a lasting change still shortens it window after window
            self._probe_gap = max(1, self._probe_gap // 2)
            self._next_probe = min(self._next_probe, self._windows + self._probe_gap)
            self._rest = {j: w - (w - self._windows) // 2 for j, w in self._rest.items() if w > self._windows}
            self._settled_cost = here
        # every cap measured just now (calls smaller than the cap fill the smaller caps' bins for
        # free): jump to the cheapest that beats this one, not one step at a time
        fresh = {j: self._fresh(j) for j in range(self._ceiling + 1) if j != self._i}
        better = [j for j, c in fresh.items() if c is not None and self._cheaper(j, self._i)]
        if better:
            j = min(better, key=lambda j: self._bins[j].cost or 0.0)
            self._move(j, f"per-item {self._ms(fresh[j] or 0.0)} at {self.sizes[j]} < {self._ms(here)} at {self.cap}")
            return
        if self._windows >= self._next_probe:
            self._probe(depth)

    def _probe(self, depth: int) -> None:
        """Try a smaller cap that the occasional smaller call showed cheaper (the cheapest), else
        the smaller cap or larger neighbour measured longest ago (never a cap the queue could not
        fill). Smaller caps are all candidates, not only the neighbour: per-item cost can be flat
        between neighbours and fall further down (rec here: 62 ms at 4, 60 at 2, 52 at 1)."""
        here = self._bins[self._i].cost
        if self._starting and self._sweep(here):
            return
        hinted = [
            j
            for j in range(self._i - 1)
            if here is not None
            and self._bins[j].samples >= 2
            and self._windows - self._bins[j].window <= self.stale_windows
            and (self._bins[j].cost or 0.0) < here * (1 - self.hysteresis)
        ]
        up = self._i + 1
        allowed = [j for j in range(min(self._i, self._ceiling + 1)) if self._worth_probing(j, here)]
        if up <= self._ceiling and depth >= self.sizes[up] and self._worth_probing(up, here):
            allowed.append(up)
        if hinted:  # rec at cap 4 with a call of 1 now and then: 1 is probed at once, not after 2
            j = min(hinted, key=lambda j: self._bins[j].cost or 0.0)
        elif allowed:
            # the cap probed longest ago (calls smaller than the cap refresh a small cap's bin now
            # and then, which is not a measurement at that cap: at cap 2, 4 was probed over and over)
            j = min(allowed, key=lambda j: (self._probed.get(j, -1), j))
        else:
            return
        self._start_probe(j)

    def _sweep(self, here: float | None) -> bool:
        """The start sweep: probe the next smaller cap not probed yet (one that calls showed
        cheaper first, else the smallest), whatever it was measured at before; False, and the
        start over, when none is left or after ``4 * len(sizes)`` windows."""
        todo = [j for j in range(min(self._i, self._ceiling + 1)) if j not in self._probed]
        if not todo or self._windows > 4 * len(self.sizes):
            self._starting = False
            return False
        hinted = [
            j
            for j in todo
            if here is not None
            and self._bins[j].samples >= 2
            and (self._bins[j].cost or 0.0) < here * (1 - self.hysteresis)
        ]
        self._start_probe(min(hinted, key=lambda j: self._bins[j].cost or 0.0) if hinted else todo[0])
        return True

    def _start_probe(self, j: int) -> None:
        self._probed[j] = self._windows
        self._bins[j] = _Bin()  # measure it afresh
        self._probe_from, self._i, self._probe_windows = self._i, j, 0
        self._changed = self._windows
        self._record(f"probe {self.cap} (from {self.sizes[self._probe_from]})")

    def _back_off(self) -> None:
        """After a probe that lost or found no calls: double the gap to the next probe (not during
        the start sweep, which goes on to the next smaller cap after one window at home)."""
        if not self._starting:
            self._probe_gap = min(self.max_probe_gap, self._probe_gap * 2)
        self._next_probe = self._windows + self._probe_gap

    def _worth_probing(self, j: int, here: float | None) -> bool:
        """Whether cap ``j`` may be probed: not when it was measured within ``max_probe_gap``
        windows at more than ``(1 + probe_margin)`` times the current cap's per-item cost. A cap
        that lost by that much loses again unless the costs changed — and a probe of a far worse
        cap is what hurts: silero-vad at 4,000 windows/s, settled at 32, lost every probe of 1
        (0.2 ms a window vs 0.055), yet each drift of the noisy cost re-opened all of them."""
        if self._rest.get(j, 0) > self._windows:
            return False  # it cost more than the current cap a short while ago (a probe that lost)
        b = self._bins[j]
        if here is None or b.cost is None or b.samples < self.min_samples:
            return True
        if self._windows - b.window > self.max_probe_gap:
            return True  # measured too long ago: costs may have changed since
        return b.cost <= here * (1 + self.probe_margin)

    def _end_probe(self) -> None:
        assert self._probe_from is not None
        home, probed = self._probe_from, self._i
        there, back = self._known(probed), self._known(home, max_age=self._probe_windows + 2)
        self._probe_windows += 1
        if there is None and self._probe_windows < 2:
            return  # not enough calls at the probed cap yet
        if (
            there is not None
            and back is not None
            and self._probe_windows < 3
            and there < back * (1 - self.hysteresis)
            and not self._cheaper(probed, home)
        ):
            return  # cheaper by the hysteresis but not yet by three times the noise: one more window
        self._probe_from = None
        self._changed = self._windows
        if there is None:  # traffic fell: calls do not fill the probed cap, so it cannot be measured
            self._i = home
            self._back_off()
            self._record(f"probe abandoned: no calls filled cap {self.sizes[probed]}")
            return
        kept_smaller = (
            back is not None
            and probed < home
            and there < back * (1 - self._margin(probed))
            and not self._cheaper(probed, home)
        )
        if back is None or self._cheaper(probed, home) or kept_smaller:
            self._left[home] = self._windows
            self._probe_gap = 1
            self._next_probe = self._windows + 1
            self._settled_cost = there
            cost = "unmeasured (calls no longer fill it)" if back is None else self._ms(back)
            within = " (within the noise: the smaller cap is kept)" if kept_smaller else ""
            self._record(f"probe won: per-item {self._ms(there)} at {self.cap} < {cost} at {self.sizes[home]}{within}")
            return
        self._i = home
        self._back_off()
        self._settled_cost = back
        spent = self._probe_windows * self.sizes[probed] / self.cap  # in windows of calls at the home cap
        self._rest_cap(probed, there / back - 1 if back > 0 else 0.0, spent)
        self._record(
            f"probe lost: per-item {self._ms(there)} at {self.sizes[probed]} vs {self._ms(back)} at {self.cap}"
        )

    def _rest_cap(self, j: int, excess: float, windows: float) -> None:
        """Cap ``j`` cost ``excess`` (a fraction) more per item than the current cap over the items of
        ``windows`` windows at the current cap (a window at cap 2 holds twice the items of one at 1):
        not probed for ``excess * windows / probe_budget`` windows (``max_probe_gap`` at most), so
        probes that lose cost at most about ``probe_budget`` of the compute."""
        if excess <= 0 or self.probe_budget <= 0:
            return
        rest = min(self.max_probe_gap, math.ceil(excess * windows / self.probe_budget))
        self._rest[j] = max(self._rest.get(j, 0), self._windows + rest)

    def _move(self, j: int, reason: str) -> None:
        self._left[self._i] = self._windows
        self._changed = self._windows
        self._i = j
        self._probe_gap, self._next_probe = 1, self._windows + 1
        self._settled_cost = self._known(j)
        self._record(reason)

    def _latency(self, latencies: list[float]) -> bool:
        """Keep the window's p95 under the target; True when it changed a setting."""
        assert self.target_p95_ms is not None
        ordered = sorted(latencies)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
        target = self.target_p95_ms
        if p95 > target:
            if self._wait_ms > 0 and self.cap > 1:
                self._wait_ms = self._wait_ms / 2 if self._wait_ms > 0.25 else 0.0
                self._record(f"p95 {p95:.3g} ms > target {target:g} ms: wait down")
                return True
            if self._i > 0:
                self._probe_from = None
                self._i = self._ceiling = self._i - 1
                self._probe_gap, self._next_probe = 1, self._windows + 1
                self._record(f"p95 {p95:.3g} ms > target {target:g} ms: cap down")
                return True
            return False
        if p95 < target / 2:
            if self._ceiling < len(self.sizes) - 1:
                self._ceiling += 1  # allow cost to raise the cap again (it does not raise it itself)
            if self._wait_ms < self.policy.max_delay_ms and self.cap > 1:
                self._wait_ms = min(float(self.policy.max_delay_ms), max(0.25, self._wait_ms * 2))
                self._record(f"p95 {p95:.3g} ms < half the target {target:g} ms: wait up")
                return True
        return False

    def _record(self, reason: str) -> None:
        self.decisions.append(Decision(self.clock(), self.cap, self.wait_ms, reason))
