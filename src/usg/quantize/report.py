"""What ``usg quantize`` found: JSON, a rich table, HTML with a plot; and the ``GRAPH.quant.yaml`` sidecar.

Sidecar format (version 1; read by :func:`usg.graph.sidecar.apply_quant_sidecar`)::

    usg_quant: 1
    graph: graph.yaml
    guards: ["lines:char_accuracy>=0.99", ...]
    holds: true                                # the guard on all quantized models together
    models:
      det:
        path: graph.quant/det.static.onnx      # relative to the sidecar
        source: /…/ch_PP-OCRv4_det_infer.onnx  # the FP32 file it replaces
        source_bytes: 4745517                  # a changed source makes the sidecar stale
        settings: {method: static, calibration: minmax, per_channel: true, exclude_nodes: [...]}
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from usg.graph.sidecar import QUANT_SIDECAR_VERSION
from usg.quantize.runner import QuantizeResult

__all__ = ["render_text", "result_json", "write_html", "write_plot", "write_quant_sidecar"]


def result_json(result: QuantizeResult) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for name, o in result.outcomes.items():
        models[name] = {
            "status": o.status if o.path is None else "quantized",
            "path": str(o.path) if o.path else None,
            "settings": o.settings.to_json(),
            "calibration_items": o.calibration_items,
            "size_mb": o.size_mb,
            "items_per_s": o.speed,
            "alone_first": o.sensitivity.to_json() if o.sensitivity else None,
            "alone_final": o.final.to_json() if o.final else None,
            "trials": o.trials,
            "most_harmful_nodes": o.ranked[:20],
        }
    return {
        "graph": result.graph.name,
        "guards": [str(g) for g in result.guards],
        "holds": result.holds,
        "combined": result.combined.to_json() if result.combined else None,
        "calibration_samples": result.calibration_samples,
        "holdout_samples": result.holdout_samples,
        "trials": result.trials,
        "models": models,
    }


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def render_text(result: QuantizeResult, console: Console) -> None:
    table = Table(title=f"usg quantize: {result.graph.name}")
    for col in ("model", "method", "MB fp32 → int", "items/s fp32", "items/s quant", "×", "kept FP32", "alone"):
        table.add_column(col, justify="right" if col not in ("model", "method", "kept FP32", "alone") else "left")
    for name, o in result.outcomes.items():
        s = o.settings
        kept = (
            "whole model"
            if o.path is None
            else (
                f"op types {', '.join(s.exclude_op_types)}" if s.exclude_op_types else f"{len(s.exclude_nodes)} node(s)"
            )
        )
        alone = o.final or o.sensitivity
        table.add_row(
            name,
            s.method + (f"/{s.calibration}" if s.method == "static" else ""),
            f"{_fmt(o.size_mb.get('fp32'))} → {_fmt(o.size_mb.get('quantized'))}",
            _fmt(o.speed.get("fp32")),
            _fmt(o.speed.get("quantized")),
            _fmt(o.speed.get("speedup"), ".2f"),
            kept,
            "holds" if alone and alone.holds else "fails",
        )
    console.print(table)
    if result.combined is not None:
        metrics = Table(title="guard on the held-out inputs (all quantized models together)")
        for col in ("guard", "value", ""):
            metrics.add_column(col)
        for g in result.guards:
            v = result.combined.value(g)
            metrics.add_row(str(g), f"{v:.4f}", "ok" if g.holds(v) else "[red]fails[/]")
        console.print(metrics)
    if not result.holds:
        render_must_stay(result, console)


def render_must_stay(result: QuantizeResult, console: Console) -> None:
    """The table shown when the guard cannot be met: what would have to stay FP32."""
    table = Table(title="the guard does not hold: what would have to stay FP32")
    for col in ("model", "tried", "kept FP32 at the last trial", "most harmful nodes (not yet excluded)"):
        table.add_column(col)
    for name, o in result.outcomes.items():
        excluded = set(o.settings.exclude_nodes)
        rest = [n for n in o.ranked if n not in excluded][:5]
        last = "whole model" if o.path is None else f"{len(excluded)} node(s) {', '.join(o.settings.exclude_op_types)}"
        table.add_row(name, str(len(o.trials)), last, ", ".join(rest) or "—")
    console.print(table)


def write_plot(result: QuantizeResult, path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from usg.errors import MissingDependency

        raise MissingDependency("matplotlib", "report", "the usg quantize plot") from None
    names = [n for n, o in result.outcomes.items() if o.speed]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = range(len(names))
    fp = [result.outcomes[n].speed.get("fp32", 0) for n in names]
    qu = [result.outcomes[n].speed.get("quantized", 0) for n in names]
    ax1.bar([x - 0.2 for x in xs], fp, 0.4, label="FP32")
    ax1.bar([x + 0.2 for x in xs], qu, 0.4, label="quantized")
    ax1.set_xticks(list(xs), names)
    ax1.set_ylabel("items/s (model alone, its batch size)")
    ax1.legend()
    all_names = list(result.outcomes)
    xs2 = range(len(all_names))
    ax2.bar([x - 0.2 for x in xs2], [result.outcomes[n].size_mb.get("fp32", 0) for n in all_names], 0.4, label="FP32")
    ax2.bar(
        [x + 0.2 for x in xs2],
        [result.outcomes[n].size_mb.get("quantized", 0) for n in all_names],
        0.4,
        label="quantized",
    )
    ax2.set_xticks(list(xs2), all_names)
    ax2.set_ylabel("file size (MB)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kept(settings: dict[str, Any]) -> str:
    return ", ".join(settings.get("exclude_nodes", []) + settings.get("exclude_op_types", [])) or "—"


def write_html(result: QuantizeResult, path: Path) -> Path:
    """An HTML report with the models table, the guard metrics and the plot (a PNG beside it)."""
    plot = write_plot(result, path.with_suffix(".png"))
    data = result_json(result)
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{html.escape(m['settings']['method'])}</td>"
        f"<td>{m['size_mb'].get('fp32', '')}</td><td>{m['size_mb'].get('quantized', '—')}</td>"
        f"<td>{m['items_per_s'].get('fp32', '—')}</td><td>{m['items_per_s'].get('quantized', '—')}</td>"
        f"<td>{m['items_per_s'].get('speedup', '—')}</td>"
        f"<td>{html.escape(_kept(m['settings']))}</td></tr>"
        for n, m in data["models"].items()
    )
    guards = "".join(
        f"<tr><td>{html.escape(g['guard'])}</td><td>{g['value']}</td><td>{'ok' if g['holds'] else 'fails'}</td></tr>"
        for g in (data["combined"] or {}).get("guards", [])
    )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>usg quantize: {html.escape(data["graph"])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:4px 8px}}
table{{border-collapse:collapse}}</style>
</head><body><h1>usg quantize: {html.escape(data["graph"])}</h1>
<p>{data["calibration_samples"]} calibration sample(s), {data["holdout_samples"]} held out;
{data["trials"]} quantization(s);
guard {"holds" if data["holds"] else "<b>does not hold</b>"}.</p>
<table><tr><th>model</th><th>method</th><th>MB FP32</th><th>MB quantized</th><th>items/s FP32</th>
<th>items/s quantized</th><th>×</th><th>kept FP32</th></tr>{rows}</table>
<h2>Guard (held-out inputs, all quantized models together)</h2>
<table><tr><th>guard</th><th>value</th><th></th></tr>{guards}</table>
<img src="{html.escape(plot.name)}" alt="items/s and size per model"></body></html>"""
    path.write_text(doc, encoding="utf-8")
    return path


def write_quant_sidecar(result: QuantizeResult, path: Path) -> dict[str, Any]:
    import yaml

    models: dict[str, Any] = {}
    for name, o in result.outcomes.items():
        if o.path is None:
            continue
        models[name] = {
            "path": os.path.relpath(o.path, path.parent),
            "source": str(o.source),
            "source_bytes": o.source.stat().st_size,
            "settings": o.settings.to_json(),
            "size_mb": o.size_mb,
            "items_per_s": o.speed,
        }
    doc = {
        "usg_quant": QUANT_SIDECAR_VERSION,
        "graph": result.graph.source.name if result.graph.source else result.graph.name,
        "guards": [str(g) for g in result.guards],
        "holds": result.holds,
        "metrics": result.combined.to_json()["metrics"] if result.combined else {},
        "models": models,
    }
    header = "# written by `usg quantize`; applied by usg run/serve/bench (--fp32 ignores it; delete to undo)\n"
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True), encoding="utf-8")
    return doc
