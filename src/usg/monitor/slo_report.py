"""Render an SLO attribution (``usg.monitor.slo.attribute``) as HTML or PDF with matplotlib plots:
violation budget per node stacked by cause, the latency CDF against the threshold, and the timeline
of the worst request (its node spans split into queue, batch wait, compute, transfer)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from usg.errors import MissingDependency, UsageError
from usg.monitor.otlp import RequestTrace
from usg.monitor.slo import CAUSES, _node_split, critical_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["figures", "write_report"]

_COLORS = {"queue": "#d62728", "batch_wait": "#ff7f0e", "compute": "#1f77b4", "transfer": "#7f7f7f"}


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("matplotlib", "report", "usg report slo") from None
    return plt


def _budget_bars(plt: Any, data: Mapping[str, Any]) -> Figure:
    cells = data["budget"]["per_node_cause_ms"]
    source = "budget" if cells else "critical_path_time"
    cells = data[source]["per_node_cause_ms"]
    nodes = list(data[source]["per_node"])[:12]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(nodes) + 1.8))
    left = np.zeros(len(nodes))
    for cause in CAUSES:
        vals = np.array([cells.get(f"{n}/{cause}", 0.0) for n in nodes])
        ax.barh(nodes, vals, left=left, color=_COLORS[cause], label=cause)
        left += vals
    ax.invert_yaxis()
    ax.set_xlabel(
        "ms summed over violating requests" + (" (excess over compliant median)" if source == "budget" else "")
    )
    ax.set_title(
        f"Violation budget per node and cause — {data['violating']} of {data['requests']} requests > "
        f"{data['threshold_ms']:g} ms"
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def _cdf(plt: Any, data: Mapping[str, Any]) -> Figure:
    x = np.sort(np.asarray(data["latencies_ms"]))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(x, np.arange(1, len(x) + 1) / len(x), drawstyle="steps-post", color="#1f77b4")
    ax.axvline(data["threshold_ms"], color="#d62728", linestyle="--", label=f"SLO {data['slo']}")
    ax.axvline(
        data["value_ms"], color="#2ca02c", linestyle=":", label=f"{data['statistic']} = {data['value_ms']:.0f} ms"
    )
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title("Latency CDF")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def _timeline(plt: Any, req: RequestTrace) -> Figure:
    on_path = {n.node for n, _, _ in critical_path(req)}
    nodes = sorted(req.nodes, key=lambda n: n.start_ms)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(nodes) + 1.8))
    for i, n in enumerate(nodes):
        start = n.start_ms
        for cause, ms in _node_split(n).items():
            if ms <= 0:
                continue
            ax.barh(i, ms, left=start, color=_COLORS[cause], edgecolor="black" if n.node in on_path else "none")
            start += ms
    ax.set_yticks(range(len(nodes)), [("★ " if n.node in on_path else "") + n.node for n in nodes])
    ax.invert_yaxis()
    ax.set_xlim(0, max(req.latency_ms, 1.0))
    ax.set_xlabel("ms since the request started (★, outlined: critical path)")
    ax.set_title(f"Timeline of request {req.request_id} ({req.latency_ms:.0f} ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=_COLORS[c]) for c in CAUSES]
    ax.legend(handles, CAUSES, loc="lower right")
    fig.tight_layout()
    return fig


def figures(data: Mapping[str, Any], requests: Sequence[RequestTrace]) -> list[tuple[str, Figure]]:
    plt = _plt()
    out = [("Violation budget", _budget_bars(plt, data)), ("Latency CDF", _cdf(plt, data))]
    if data["worst"]:
        worst = next(r for r in requests if r.trace_id == data["worst"][0]["trace_id"])
        out.append(("Worst request", _timeline(plt, worst)))
    return out


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode()


def _summary_lines(data: Mapping[str, Any], metrics: Mapping[str, float] | None) -> list[str]:
    verdict = "met" if data["met"] else "VIOLATED"
    lines = [
        f"SLO {data['slo']}: {verdict} ({data['statistic']} = {data['value_ms']:.1f} ms, {data['requests']} requests)",
        f"{data['violating']} request(s) above {data['threshold_ms']:g} ms",
    ]
    budget = data["budget"] if data["budget"]["total_ms"] else data["critical_path_time"]
    for node, share in list(budget["per_node"].items())[:5]:
        lines.append(f"node {node}: {share:.1%} of the violation budget")
    for cause, share in budget["per_cause"].items():
        lines.append(f"cause {cause}: {share:.1%}")
    for key, value in (metrics or {}).items():
        lines.append(f"metric {key} = {value:g}")
    return lines


def _html(data: Mapping[str, Any], figs: list[tuple[str, Figure]], metrics: Mapping[str, float] | None) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(w['request_id'])}</td><td>{w['latency_ms']:.1f}</td><td>{esc(w['status'])}</td>"
        f"<td>{esc(' → '.join(w['critical_path']))}</td><td>"
        + ", ".join(f"{esc(k)} {v:.1f}" for k, v in list(w["split_ms"].items())[:6])
        + "</td></tr>"
        for w in data["worst"]
    )
    budget = data["budget"] if data["budget"]["total_ms"] else data["critical_path_time"]
    share_rows = "".join(f"<tr><td>{esc(n)}</td><td>{s:.1%}</td></tr>" for n, s in budget["per_node"].items())
    cause_rows = "".join(f"<tr><td>{esc(c)}</td><td>{s:.1%}</td></tr>" for c, s in budget["per_cause"].items())
    imgs = "".join(f'<h2>{esc(t)}</h2><img alt="{esc(t)}" src="data:image/png;base64,{_png(f)}">' for t, f in figs)
    summary = "".join(f"<li>{esc(line)}</li>" for line in _summary_lines(data, metrics))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>USG SLO report</title><style>"
        "body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}</style></head><body>"
        f"<h1>SLO attribution: {esc(data['slo'])}</h1><ul>{summary}</ul>"
        "<h2>Share of the violation budget per node</h2>"
        f"<table><tr><th>node</th><th>share</th></tr>{share_rows}</table>"
        f"<h2>Per cause</h2><table><tr><th>cause</th><th>share</th></tr>{cause_rows}</table>{imgs}"
        "<h2>Worst requests</h2><table><tr><th>request</th><th>ms</th><th>status</th><th>critical path</th>"
        f"<th>largest parts (node/cause ms)</th></tr>{rows}</table></body></html>"
    )


def write_report(
    data: Mapping[str, Any],
    requests: Sequence[RequestTrace],
    path: Path,
    *,
    metrics: Mapping[str, float] | None = None,
) -> None:
    """Write ``path`` as HTML (``.html``) or PDF (``.pdf``: a summary page, then one page per plot)."""
    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".pdf"):
        raise UsageError(f"-o {path}: unknown report format {suffix!r}; fix: end the name in .html or .pdf")
    plt = _plt()
    figs = figures(data, requests)
    try:
        if suffix == ".pdf":
            from matplotlib.backends.backend_pdf import PdfPages

            with PdfPages(path) as pdf:
                page = plt.figure(figsize=(8.27, 11.69))
                page.text(0.06, 0.95, "USG SLO attribution", fontsize=16, va="top")
                page.text(0.06, 0.9, "\n".join(_summary_lines(data, metrics)), fontsize=9, va="top", family="monospace")
                pdf.savefig(page)
                plt.close(page)
                for _, fig in figs:
                    pdf.savefig(fig)
        else:
            path.write_text(_html(data, figs, metrics), encoding="utf-8")
    finally:
        for _, fig in figs:
            plt.close(fig)
