"""``usg report slo TRACES… --slo "p95<800ms" [--metrics URL] -o report.html|report.pdf``."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from usg.cli.common import err_console, out_console
from usg.errors import UsageError

__all__ = ["report"]

_METRICS = ("usg_health_score", "usg_drift_detected", "usg_rejected_requests_total", "usg_inflight_requests")


def _scrape(url: str) -> dict[str, float]:
    """A few headline series of a running server's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(
            f"--metrics {url}: cannot fetch it ({exc}); fix: pass a running server's /metrics URL"
        ) from None
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in _METRICS or s.name.startswith("usg_health_component_score"):
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{label}}}" if label else s.name] = float(s.value)
    return out


@click.group("report")
def report() -> None:
    """Reports built from the server's traces and metrics."""


@report.command("slo")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--slo", "slo_text", required=True, help='The objective, e.g. "p95<800ms", "p99<1.5s", "mean<200ms".')
@click.option(
    "--metrics", "metrics_url", default=None, metavar="URL", help="A server's /metrics to quote in the report."
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="report.html or report.pdf")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the figures as JSON.")
def slo(traces: tuple[str, ...], slo_text: str, metrics_url: str | None, output: str, json_out: str | None) -> None:
    """Attribute SLO violations to graph nodes and causes (queue, batch wait, compute, transfer)."""
    from usg.monitor.otlp import read_traces
    from usg.monitor.slo import attribute, parse_slo
    from usg.monitor.slo_report import write_report

    objective = parse_slo(slo_text)
    skipped: list[str] = []
    with err_console.status(f"reading {len(traces)} trace file(s)"):
        requests = read_traces([Path(t) for t in traces], skipped)
    if skipped:
        err_console.print(
            f"[yellow]note:[/] {len(skipped)} span(s) could not be read and are left out (first: {escape(skipped[0])})"
        )
    data = attribute(requests, objective)
    metrics = _scrape(metrics_url) if metrics_url else None
    with err_console.status("rendering plots"):
        write_report(data, requests, Path(output), metrics=metrics)
    if json_out:
        Path(json_out).write_text(json.dumps({**data, "metrics": metrics}, indent=1), encoding="utf-8")
    budget = data["budget"] if data["budget"]["total_ms"] else data["critical_path_time"]
    top = ", ".join(f"{n} {s:.0%}" for n, s in list(budget["per_node"].items())[:3]) or "none"
    verdict = "met" if data["met"] else "violated"
    out_console.print(
        f"SLO {data['slo']} {verdict}: {data['statistic']} = {data['value_ms']:.1f} ms over {data['requests']} "
        f"requests, {data['violating']} above the threshold; violation budget: {top} → {output}"
    )
