"""``usg bench`` as a function: start each system, check its outputs, load it, collect a report."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from usg.bench.bound import summarize_bounds
from usg.bench.equivalence import check_equivalence
from usg.bench.loadgen import LoadResult, ProgressFn, run_closed, run_open
from usg.bench.report import MIN_RELIABLE_REQUESTS, BenchReport, coarse_count_note, run_label
from usg.bench.samples import Sample, repeat_sampler, sample_cycle
from usg.bench.targets import InProcessTarget, UrlTarget, is_url
from usg.errors import UsageError
from usg.graph.model import Graph

__all__ = ["BenchConfig", "run_bench"]

# (system, load level label) -> a progress callback for that run
ProgressFactory = Callable[[str, str, float], ProgressFn | None]


@dataclass
class BenchConfig:
    target: str
    concurrency: tuple[int, ...] = (1, 8, 32)
    rate: float | None = None
    duration_s: float = 10.0
    warmup_s: float = 2.0
    compare: tuple[str, ...] = ()
    equivalence_samples: int = 4
    rounds: int = 1
    samples: list[Sample] = field(default_factory=list)
    repeat_rate: float | None = None  # a share of repeated inputs (the rest fresh): node cache on for USG


async def _load(target: Any, cfg: BenchConfig, level: float, progress: ProgressFn | None) -> LoadResult:
    it = sample_cycle(cfg.samples) if cfg.repeat_rate is None else repeat_sampler(cfg.samples, cfg.repeat_rate)
    mark = getattr(target, "mark", None)
    if cfg.rate is not None:
        return await run_open(
            target,
            it,
            rate=level,
            duration_s=cfg.duration_s,
            warmup_s=cfg.warmup_s,
            on_measure_start=mark,
            progress=progress,
        )
    return await run_closed(
        target,
        it,
        concurrency=int(level),
        duration_s=cfg.duration_s,
        warmup_s=cfg.warmup_s,
        on_measure_start=mark,
        progress=progress,
    )


async def _breakdown(target: Any) -> list[Any]:
    if isinstance(target, InProcessTarget):
        return target.breakdown()
    if isinstance(target, UrlTarget):
        return await target.breakdown_async()
    return []


async def run_bench(
    cfg: BenchConfig,
    graph: Graph | None,
    *,
    progress: ProgressFactory | None = None,
    log: Callable[[str], None] = lambda _msg: None,
    bound: Callable[[Mapping[str, float]], dict[str, Any]] | None = None,
) -> BenchReport:
    """Run USG (the graph in process, or the server at a URL) and each baseline at each load level.

    Every system is started (and its outputs checked against USG's) before any load runs; then,
    for each round, each load level runs on each system in turn — the order reversed every other
    round — so a change in background load on a shared machine hits all systems alike. The
    rounds of one system and level are merged (latencies pooled, durations summed). A baseline
    that burns CPU while idle (``idle_cpu``: the private Ray of ``ray-serve``) is stopped after its
    check and started again for each of its runs only, so no system is measured beside another's
    idle cluster.

    ``bound(items_per_request)`` (the model-only bound) is measured right after each USG run,
    and that run's throughput is compared with it."""
    if cfg.compare and graph is None:
        raise UsageError("--compare needs the graph the server runs; fix: pass --graph GRAPH with a URL target")
    run = _Run(cfg, graph, progress, log, bound)
    try:
        await run.start_systems()
        for rnd in range(cfg.rounds):
            await run.round(rnd)
        run.collect()
    finally:
        for target in reversed(run.systems):
            await target.aclose()
    return run.report


class _Run:
    """One ``usg bench``: the systems under test, the merged results and the model-only bounds."""

    def __init__(
        self,
        cfg: BenchConfig,
        graph: Graph | None,
        progress: ProgressFactory | None,
        log: Callable[[str], None],
        bound: Callable[[Mapping[str, float]], dict[str, Any]] | None,
    ) -> None:
        self.cfg, self.graph, self.progress, self.log, self.bound = cfg, graph, progress, log, bound
        self.levels: Sequence[float] = [cfg.rate] if cfg.rate is not None else [float(c) for c in cfg.concurrency]
        self.report = BenchReport(
            cfg.target,
            str(graph.source) if graph is not None and graph.source else None,
            "open" if cfg.rate is not None else "closed",
            cfg.duration_s * cfg.rounds,
            cfg.warmup_s,
        )
        self.usg: Any = (
            UrlTarget(cfg.target)
            if is_url(cfg.target)
            else InProcessTarget(_need(graph), cache=cfg.repeat_rate is not None)
        )
        self.systems: list[Any] = []
        self.merged: dict[tuple[str, float], LoadResult] = {}
        self.bounds: list[dict[str, Any]] = []
        self._cache_noted = False

    async def start_systems(self) -> None:
        """Start USG, then each baseline, checking the baseline's outputs against USG's."""
        from usg.bench.baselines import make_baseline

        cfg = self.cfg
        check = cfg.samples[: max(1, cfg.equivalence_samples)]
        workers = int(max(self.levels)) if cfg.rate is None else 32
        self.log(f"starting {self.usg.name} ({cfg.target})")
        await self.usg.start()
        self.systems.append(self.usg)
        reference = [await self.usg.infer(s) for s in check]
        for name in cfg.compare:
            base = make_baseline(name, _need(self.graph), workers=workers)
            self.log(f"starting baseline {name}")
            self.systems.append(base)
            await base.start()
            outs = [await base.infer(s) for s in check]
            pairs = [(s.name, r, o) for s, r, o in zip(check, reference, outs, strict=True)]
            eq = check_equivalence(name, self.usg.name, pairs)
            self.report.equivalence[name] = eq
            if not eq.ok:
                self.report.notes.append(
                    f"{name}: outputs differ from USG's, so no ratio is printed: {eq.problems[:3]}"
                )
            if _runs_only_for_its_load(base):
                await base.aclose()
                self.report.notes.append(
                    f"{name} is started before each of its runs and stopped after it, so its idle processes "
                    "do not run beside the other systems' measured windows"
                )

    async def round(self, rnd: int) -> None:
        """Every load level on every system, in the order of this round (reversed every other round)."""
        cfg = self.cfg
        order = self.systems if rnd % 2 == 0 else self.systems[::-1]
        for level in self.levels:
            for target in order:
                label = _lvl(cfg, level) + (f", round {rnd + 1}/{cfg.rounds}" if cfg.rounds > 1 else "")
                cb = self.progress(target.name, label, cfg.warmup_s + cfg.duration_s) if self.progress else None
                alone = target is not self.usg and _runs_only_for_its_load(target)
                if alone:
                    self.log(f"starting baseline {target.name} for its run")
                    await target.start()
                try:
                    result = await _load(target, cfg, level, cb)
                finally:
                    if alone:
                        await target.aclose()
                key = (target.name, level)
                result.extra.setdefault("round_rps", [result.throughput])
                if key in self.merged:
                    _merge(self.merged[key], result)
                else:
                    self.merged[key] = result
                if target is self.usg:
                    await self._after_usg_run(result, level)

    async def _after_usg_run(self, result: LoadResult, level: float) -> None:
        """USG's per-model breakdown of the run, and the model-only bound measured right after it."""
        models = await _breakdown(self.usg)
        self.report.breakdowns[run_label(result)] = models
        hits = getattr(self.usg, "last_cache_hits", 0.0)
        if hits and self.cfg.repeat_rate is None and not self._cache_noted:
            # in process the bench turns the node cache off; a server's cache is the server's, and cycling
            # over a few samples measured its hits (hundreds of requests/s, every model idle)
            self._cache_noted = True
            self.report.notes.append(
                f"{run_label(result)}: the server answered {hits:.0f} node lookups from its node cache in the "
                f"measured window (the bench cycles over {len(self.cfg.samples)} sample(s)), so its figures "
                "measure cache hits; fix: restart it with `usg serve GRAPH --no-cache`, or pass --repeat-rate R "
                "to measure a known share of repeated inputs"
            )
        if self.bound is None:
            return
        self.log("measuring the model-only bound")
        per_req = {m.model: m.items_per_request for m in models if m.requests}
        b = await asyncio.to_thread(self.bound, per_req)
        b["level"] = level
        b["usg_rps"] = result.throughput
        b["achieved"] = result.throughput / b["bound_rps"] if b["bound_rps"] > 0 else None
        serial = b.get("serial_bound_rps") or 0.0
        b["achieved_serial"] = result.throughput / serial if serial > 0 else None
        self.bounds.append(b)

    def collect(self) -> None:
        """Results in report order (systems as given, then load levels), bounds and notes."""
        for target in self.systems:
            self.report.results.extend(self.merged[(target.name, level)] for level in self.levels)
        for r in self.report.results:
            if r.completed < MIN_RELIABLE_REQUESTS:
                self.report.notes.append(
                    f"{run_label(r)} completed only {r.completed} request(s) (fewer than {MIN_RELIABLE_REQUESTS}): "
                    "ratios involving it are not reliable; fix: raise --duration (or --rounds)"
                )
            coarse = coarse_count_note(r, self.cfg.duration_s, run_label(r))
            if coarse is not None:
                self.report.notes.append(coarse)
        if self.bounds:
            self.report.bound = summarize_bounds(self.bounds, self.levels)
        if self.cfg.rounds > 1:
            self.report.notes.append(
                f"{self.cfg.rounds} rounds per system and level, order alternating; the per-model breakdown "
                "is of the last round"
            )


def _runs_only_for_its_load(target: Any) -> bool:
    """Whether ``target`` keeps processes busy while idle (``idle_cpu = True``: a private Ray cluster's
    GCS, raylet, Serve controller and replicas poll, report and health-check all the time). Such a
    system is up only for its own runs: left running, it would take CPU from the other systems'
    measured windows (and from the model-only bound measured after USG's) but never from its own."""
    return bool(getattr(target, "idle_cpu", False))


def _need(graph: Graph | None) -> Graph:
    if graph is None:
        raise UsageError("this run needs a graph file; fix: pass GRAPH (or --graph GRAPH with a URL target)")
    return graph


def _merge(into: LoadResult, more: LoadResult) -> None:
    into.extra.setdefault("round_rps", []).extend(more.extra.get("round_rps", [more.throughput]))
    into.latencies_ms.extend(more.latencies_ms)
    into.duration_s += more.duration_s
    into.errors += more.errors
    into.rejected += more.rejected
    into.error_samples.extend(more.error_samples[: max(0, 5 - len(into.error_samples))])


def _lvl(cfg: BenchConfig, level: float) -> str:
    return f"{level:g} req/s" if cfg.rate is not None else f"{int(level)} clients"
