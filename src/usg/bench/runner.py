"""``usg bench`` as a function: start each system, check its outputs, load it, collect a report."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from usg.bench.equivalence import check_equivalence
from usg.bench.loadgen import LoadResult, ProgressFn, run_closed, run_open
from usg.bench.report import BenchReport, run_label
from usg.bench.samples import Sample, sample_cycle
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


async def _load(target: Any, cfg: BenchConfig, level: float, progress: ProgressFn | None) -> LoadResult:
    it = sample_cycle(cfg.samples)
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
    rounds of one system and level are merged (latencies pooled, durations summed).

    ``bound(items_per_request)`` (the model-only bound) is measured right after each USG run,
    and that run's throughput is compared with it."""
    from usg.bench.baselines import make_baseline

    if cfg.compare and graph is None:
        raise UsageError("--compare needs the graph the server runs; fix: pass --graph GRAPH with a URL target")
    levels: Sequence[float] = [cfg.rate] if cfg.rate is not None else [float(c) for c in cfg.concurrency]
    report = BenchReport(
        cfg.target,
        str(graph.source) if graph is not None and graph.source else None,
        "open" if cfg.rate is not None else "closed",
        cfg.duration_s * cfg.rounds,
        cfg.warmup_s,
    )
    usg: Any = UrlTarget(cfg.target) if is_url(cfg.target) else InProcessTarget(_need(graph))
    check = cfg.samples[: max(1, cfg.equivalence_samples)]
    workers = int(max(levels)) if cfg.rate is None else 32
    systems: list[Any] = []
    try:
        log(f"starting {usg.name} ({cfg.target})")
        await usg.start()
        systems.append(usg)
        reference = [await usg.infer(s) for s in check]
        for name in cfg.compare:
            base = make_baseline(name, _need(graph), workers=workers)
            log(f"starting baseline {name}")
            systems.append(base)
            await base.start()
            outs = [await base.infer(s) for s in check]
            pairs = [(s.name, r, o) for s, r, o in zip(check, reference, outs, strict=True)]
            eq = check_equivalence(name, usg.name, pairs)
            report.equivalence[name] = eq
            if not eq.ok:
                report.notes.append(f"{name}: outputs differ from USG's, so no ratio is printed: {eq.problems[:3]}")
        merged: dict[tuple[str, float], LoadResult] = {}
        bounds: list[dict[str, Any]] = []
        for rnd in range(cfg.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]
            for level in levels:
                for target in order:
                    label = _lvl(cfg, level) + (f", round {rnd + 1}/{cfg.rounds}" if cfg.rounds > 1 else "")
                    cb = progress(target.name, label, cfg.warmup_s + cfg.duration_s) if progress else None
                    result = await _load(target, cfg, level, cb)
                    key = (target.name, level)
                    if key in merged:
                        _merge(merged[key], result)
                    else:
                        merged[key] = result
                    if target is usg:
                        models = await _breakdown(usg)
                        report.breakdowns[run_label(result)] = models
                        if bound is not None:
                            log("measuring the model-only bound")
                            per_req = {m.model: m.items_per_request for m in models if m.requests}
                            b = await asyncio.to_thread(bound, per_req)
                            b["level"] = level
                            b["achieved"] = result.throughput / b["bound_rps"] if b["bound_rps"] > 0 else None
                            bounds.append(b)
        # report order: systems as given, then load levels
        for target in systems:
            report.results.extend(merged[(target.name, level)] for level in levels)
        if bounds:
            report.bound = _summarize_bounds(bounds, levels)
        if cfg.rounds > 1:
            report.notes.append(
                f"{cfg.rounds} rounds per system and level, order alternating; the per-model breakdown "
                "is of the last round"
            )
    finally:
        for target in reversed(systems):
            await target.aclose()
    return report


def _summarize_bounds(bounds: list[dict[str, Any]], levels: Sequence[float]) -> dict[str, Any]:
    """The last measurement's detail, the mean bound, and per level the mean achieved fraction."""
    summary = dict(bounds[-1])
    summary["bound_rps"] = sum(b["bound_rps"] for b in bounds) / len(bounds)
    summary["measurements"] = [
        {"level": b["level"], "bound_rps": b["bound_rps"], "achieved": b["achieved"]} for b in bounds
    ]
    achieved: dict[str, float] = {}
    for level in levels:
        fracs = [b["achieved"] for b in bounds if b["level"] == level and b["achieved"] is not None]
        if fracs:
            achieved[f"{level:g}"] = sum(fracs) / len(fracs)
    summary["achieved"] = achieved
    summary.pop("level", None)
    return summary


def _need(graph: Graph | None) -> Graph:
    if graph is None:
        raise UsageError("this run needs a graph file; fix: pass GRAPH (or --graph GRAPH with a URL target)")
    return graph


def _merge(into: LoadResult, more: LoadResult) -> None:
    into.latencies_ms.extend(more.latencies_ms)
    into.duration_s += more.duration_s
    into.errors += more.errors
    into.rejected += more.rejected
    into.error_samples.extend(more.error_samples[: max(0, 5 - len(into.error_samples))])


def _lvl(cfg: BenchConfig, level: float) -> str:
    return f"{level:g} req/s" if cfg.rate is not None else f"{int(level)} clients"
