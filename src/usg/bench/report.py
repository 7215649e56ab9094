"""The benchmark report: a frozen summary of the runs, rendered as rich tables or JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from usg.bench.breakdown import ModelBreakdown
from usg.bench.equivalence import Equivalence
from usg.bench.loadgen import LoadResult

__all__ = ["BenchReport", "coarse_count_note", "ratio_rows", "render_report", "report_json"]


@dataclass
class BenchReport:
    target: str
    graph: str | None
    mode: str  # closed | open
    duration_s: float
    warmup_s: float
    results: list[LoadResult] = field(default_factory=list)
    breakdowns: dict[str, list[ModelBreakdown]] = field(default_factory=dict)  # key: run label
    equivalence: dict[str, Equivalence] = field(default_factory=dict)
    bound: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    reference: str = "usg"

    def find(self, system: str, level: float | None) -> LoadResult | None:
        for r in self.results:
            if r.system == system and _level(r) == level:
                return r
        return None

    @property
    def systems(self) -> list[str]:
        seen: list[str] = []
        for r in self.results:
            if r.system not in seen:
                seen.append(r.system)
        return seen


def _level(r: LoadResult) -> float | None:
    return float(r.concurrency) if r.mode == "closed" and r.concurrency is not None else r.rate


def _spread(bound: dict[str, Any], key: str) -> str:
    """`` (single measurements lo–hi)`` when the bound was measured more than once."""
    lo_hi = bound.get(key)
    if not lo_hi or len(bound.get("measurements") or []) < 2:
        return ""
    return f" (single measurements {lo_hi[0]:.2f}–{lo_hi[1]:.2f})"


def run_label(r: LoadResult) -> str:
    return f"{r.system}@c{r.concurrency}" if r.mode == "closed" else f"{r.system}@{r.rate:g}rps"


def ratio_rows(report: BenchReport) -> list[dict[str, Any]]:
    """USG's throughput (and p95) relative to each baseline at each load level.

    No ratio for a baseline whose outputs differ from USG's (``refused``)."""
    rows: list[dict[str, Any]] = []
    for r in report.results:
        if r.system == report.reference:
            continue
        ref = report.find(report.reference, _level(r))
        eq = report.equivalence.get(r.system)
        row: dict[str, Any] = {"system": r.system, "level": _level(r), "mode": r.mode}
        if eq is not None and not eq.ok:
            row.update(throughput_ratio=None, p95_ratio=None, refused="outputs differ from USG's")
        elif ref is None or r.throughput == 0:
            row.update(throughput_ratio=None, p95_ratio=None, refused="no comparable USG run")
        else:
            row.update(
                throughput_ratio=ref.throughput / r.throughput,
                p95_ratio=(r.p(95) / ref.p(95)) if ref.p(95) > 0 else None,
                refused=None,
            )
            row.update(_round_spread(ref, r))
        row["few_requests"] = min(r.completed, ref.completed if ref is not None else 0) < MIN_RELIABLE_REQUESTS
        rows.append(row)
    return rows


#: fewer completed requests than this make a ratio unreliable (a warning is printed beside it)
MIN_RELIABLE_REQUESTS = 30

#: a closed-loop client should finish at least this many requests a round for its count to be a rate
MIN_REQUESTS_PER_CLIENT_ROUND = 3


def coarse_count_note(r: LoadResult, round_s: float, label: str) -> str | None:
    """A note when a closed-loop run's requests took so long against its round that its count is
    not a rate: each client finished fewer than :data:`MIN_REQUESTS_PER_CLIENT_ROUND` requests a
    round, so the count moves in whole requests per client. Worst when the clients run side by side
    and finish together (RapidOCR's thread pool, one worker a client): 16 clients whose requests
    all take anything from half a round to a whole one complete exactly 16 a round. The note gives
    the closed-loop rate of Little's law (clients / mean latency) beside the counted one."""
    if r.mode != "closed" or not r.concurrency or not r.latencies_ms or round_s <= 0:
        return None
    p50_s = r.p(50) / 1000.0
    if p50_s * MIN_REQUESTS_PER_CLIENT_ROUND <= round_s:
        return None
    little = r.concurrency * 1000.0 / (sum(r.latencies_ms) / len(r.latencies_ms))
    return (
        f"{label}: its requests took {p50_s:.1f} s (p50) in {round_s:g} s rounds, so each of its "
        f"{r.concurrency} clients finished about {round_s / p50_s:.1f} a round and its count moves in whole "
        f"requests per client (clients that finish together count the same for any request time from half a "
        f"round to a whole one); its clients / mean latency is {little:.2f} req/s against {r.throughput:.2f} "
        f"counted; fix: raise --duration to at least {math.ceil(p50_s * 5):d} s"
    )


def _round_spread(ref: LoadResult, r: LoadResult) -> dict[str, Any]:
    """Per-round throughput ratios (USG / baseline) when both ran the same rounds: their min and max."""
    usg, base = ref.extra.get("round_rps") or [], r.extra.get("round_rps") or []
    if len(usg) < 2 or len(usg) != len(base):
        return {"round_ratios": None}
    ratios = [u / b if b > 0 else float("inf") for u, b in zip(usg, base, strict=True)]
    return {"round_ratios": ratios}


def report_json(report: BenchReport) -> dict[str, Any]:
    return _clean(
        {
            "target": report.target,
            "graph": report.graph,
            "mode": report.mode,
            "duration_s": report.duration_s,
            "warmup_s": report.warmup_s,
            "results": [r.summary() for r in report.results],
            "breakdown": {k: [m.to_json() for m in v] for k, v in report.breakdowns.items()},
            "equivalence": {k: v.to_json() for k, v in report.equivalence.items()},
            "ratios": ratio_rows(report),
            "bound": report.bound,
            "notes": report.notes,
        }
    )


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 4)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _fmt(x: float | None, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def render_report(report: BenchReport, console: Any) -> None:
    """Print the tables with ``rich``: runs, per-model breakdown, equivalence, ratios, bound."""
    from rich.table import Table

    level_name = "clients" if report.mode == "closed" else "rate (req/s)"
    runs = Table(
        title=f"usg bench {report.target} — {report.duration_s:g} s measured after {report.warmup_s:g} s warm-up"
    )
    for col in ("system", level_name, "done", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors", "rejected"):
        runs.add_column(col, justify="left" if col == "system" else "right")
    for r in report.results:
        runs.add_row(
            r.system,
            _fmt(_level(r), "g"),
            str(r.completed),
            _fmt(r.throughput, ".2f"),
            _fmt(r.p(50)),
            _fmt(r.p(95)),
            _fmt(r.p(99)),
            f"{r.error_rate:.1%}",
            f"{r.rejection_rate:.1%}",
        )
    console.print(runs)
    for label, models in report.breakdowns.items():
        if not models:
            continue
        t = Table(title=f"per-model breakdown: {label}")
        for col in (
            "model",
            "items/req",
            "calls",
            "mean batch",
            "batch sizes",
            "queue ms/item",
            "compute ms/call",
            "padding waste",
            "batch cap",
            "controller",
        ):
            t.add_column(col, justify="left" if col in ("model", "batch sizes", "controller") else "right")
        for m in models:
            sizes = " ".join(f"{k}:{v}" for k, v in sorted(m.batch_sizes.items())[:8])
            t.add_row(
                m.model,
                _fmt(m.items_per_request, ".2f"),
                str(m.calls),
                _fmt(m.mean_batch, ".2f"),
                sizes,
                _fmt(m.queue_ms_mean, ".2f"),
                _fmt(m.compute_ms_mean, ".2f"),
                f"{m.padding_waste:.1%}",
                "" if m.batch_cap is None else str(m.batch_cap),
                m.controller,
            )
        console.print(t)
    if report.equivalence:
        t = Table(title="same outputs as USG? (OCR text equal, embeddings within 1e-4 cosine)")
        t.add_column("system")
        t.add_column("samples", justify="right")
        t.add_column("verdict")
        for name, eq in report.equivalence.items():
            verdict = "equal" if eq.ok else "DIFFERENT: " + "; ".join(eq.problems[:3])
            t.add_row(name, str(eq.samples), verdict)
        console.print(t)
    rows = ratio_rows(report)
    if rows:
        t = Table(title="USG relative to each baseline (throughput ×, p95 latency ×)")
        for col in ("baseline", level_name, "USG throughput ×", "baseline p95 / USG p95"):
            t.add_column(col, justify="left" if col == "baseline" else "right")
        for row in rows:
            if row["refused"]:
                t.add_row(row["system"], _fmt(row["level"], "g"), f"refused: {row['refused']}", "–")
            else:
                spread = row.get("round_ratios")
                text = _fmt(row["throughput_ratio"], ".2f") + "×"
                if spread:
                    text += f" ({min(spread):.2f}–{max(spread):.2f} over {len(spread)} rounds)"
                if row.get("few_requests"):
                    text += f" ⚠ < {MIN_RELIABLE_REQUESTS} requests"
                t.add_row(row["system"], _fmt(row["level"], "g"), text, _fmt(row["p95_ratio"], ".2f") + "×")
        console.print(t)
    if report.bound:
        b = report.bound
        console.print(
            f"model-only bound: {b['bound_rps']:.2f} req/s{_spread(b, 'bound_range')} ({b['basis']}); "
            f"bottleneck {b['bottleneck']}; "
            + "; ".join(f"USG at {lvl} clients: {frac:.0%} of the bound" for lvl, frac in b.get("achieved", {}).items())
        )
        if b.get("serial_bound_rps"):
            console.print(
                f"no-overlap model-only bound (the models share the cores): {b['serial_bound_rps']:.2f} req/s"
                f"{_spread(b, 'serial_bound_range')}; "
                + "; ".join(
                    f"USG at {lvl} clients: {frac:.0%} of it" for lvl, frac in b.get("achieved_serial", {}).items()
                )
                + "; per model: "
                + ", ".join(
                    f"{m} {d['items_per_request']:.3g} items x {1e3 / d['machine_items_per_s']:.3g} ms "
                    f"(batch {d['batch']}, {d['threads']} thread(s) x {d['instances']})"
                    for m, d in (b.get("per_model") or {}).items()
                    if d.get("machine_items_per_s")
                )
            )
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
