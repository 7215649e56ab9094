"""PNG plots of a benchmark report: latency CDF per system, throughput vs concurrency."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from usg.bench.report import BenchReport
from usg.errors import MissingDependency

__all__ = ["write_plots"]


def _pyplot() -> object:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("matplotlib", "report", "usg bench --plot") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def write_plots(report: BenchReport, out_dir: str | Path) -> list[Path]:
    """Write ``latency_cdf.png`` (one curve per system and load level) and, for closed-loop runs
    at several levels, ``throughput.png`` (requests/s vs concurrent clients). Returns the paths."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 5))  # type: ignore[attr-defined]
    for r in report.results:
        if not r.latencies_ms:
            continue
        xs = np.sort(np.asarray(r.latencies_ms))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        level = f"c={r.concurrency}" if r.mode == "closed" else f"{r.rate:g} req/s"
        ax.plot(xs, ys, label=f"{r.system} ({level})")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"latency CDF — {report.target}")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize="small")
    else:  # no request completed in the measured window (an overloaded machine, or every request failed)
        ax.text(0.5, 0.5, "no request completed", ha="center", va="center", transform=ax.transAxes)
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)  # type: ignore[attr-defined]
    written.append(path)

    if report.mode == "closed":
        fig, ax = plt.subplots(figsize=(8, 5))  # type: ignore[attr-defined]
        for system in report.systems:
            runs = sorted((r for r in report.results if r.system == system), key=lambda r: r.concurrency or 0)
            ax.plot([r.concurrency for r in runs], [r.throughput for r in runs], marker="o", label=system)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("throughput (requests/s)")
        ax.set_title(f"throughput vs concurrency — {report.target}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        path = out / "throughput.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)  # type: ignore[attr-defined]
        written.append(path)
    return written
