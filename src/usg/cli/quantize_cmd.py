"""``usg quantize GRAPH --inputs DIR``: a thin wrapper over :mod:`usg.quantize`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from usg.cli.common import err_console, load_graph_for_cli, out_console
from usg.errors import InputError, UsageError

__all__ = ["quantize"]


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--inputs",
    "inputs_path",
    required=True,
    help="Images and/or .txt files (a folder or one file) the graph runs on: calibration and held-out guard inputs.",
)
@click.option("--models", default="", help="Comma-separated ONNX models to quantize (default: all of them).")
@click.option("--method", type=click.Choice(["static", "dynamic", "int4"]), default="static", show_default=True)
@click.option(
    "--calibration", type=click.Choice(["minmax", "entropy", "percentile"]), default="minmax", show_default=True
)
@click.option(
    "--guard",
    "guards",
    multiple=True,
    metavar="OUTPUT:METRIC>=X",
    help="e.g. lines:char_accuracy>=0.99, text_embedding:cosine>=0.995, out:max_rel<=0.05. Repeatable; "
    "default: one per output by its type.",
)
@click.option("--holdout", type=float, default=0.25, show_default=True, help="Share of the inputs kept for the guard.")
@click.option(
    "--fallback", type=click.Choice(["nodes", "op-types"]), default="nodes", show_default=True,
    help="What to keep in FP32 while the guard fails: the most harmful nodes, or whole op types.",
)  # fmt: skip
@click.option("--max-trials", type=click.IntRange(min=1), default=12, show_default=True, help="Re-quantizations.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Folder for the quantized files.")
@click.option("--no-measure", is_flag=True, help="Skip timing FP32 vs quantized.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write an HTML report (and its plot).")
def quantize(
    graph_path: str,
    inputs_path: str,
    models: str,
    method: str,
    calibration: str,
    guards: tuple[str, ...],
    holdout: float,
    fallback: str,
    max_trials: int,
    out_dir: str | None,
    no_measure: bool,
    as_json: bool,
    html_path: str | None,
) -> None:
    """Quantize a graph's models, guarded on its end outputs; writes GRAPH.quant.yaml."""
    from usg.bench.samples import load_samples
    from usg.graph.sidecar import quant_sidecar_path
    from usg.quantize import QuantizeConfig, QuantSettings, measure_speed, parse_guard, quantize_graph
    from usg.quantize.report import render_text, result_json, write_html, write_quant_sidecar

    parsed = tuple(parse_guard(g) for g in guards)
    names = tuple(n.strip() for n in models.split(",") if n.strip())
    graph = load_graph_for_cli(graph_path, quantized=False)  # tuned batch sizes apply; FP32 models
    samples = load_samples(inputs_path, graph, required=True)
    sidecar = quant_sidecar_path(Path(graph_path).resolve())
    target = Path(out_dir) if out_dir else sidecar.with_suffix("")  # GRAPH.quant/
    _check_outputs(target, Path(html_path) if html_path else None)  # before minutes of calibration
    config = QuantizeConfig(
        names, QuantSettings(method, calibration), guards=parsed, holdout=holdout, fallback=fallback,
        max_trials=max_trials,
    )  # fmt: skip

    def log(msg: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{msg}[/]")

    with err_console.status("quantizing (calibration, guard, fallback)", spinner="dots") as status:

        def progress(msg: str) -> None:
            status.update(msg)
            log(msg)

        result = quantize_graph(graph, samples, config, target, log=progress)
        if not no_measure:
            status.update("timing FP32 vs quantized")
            measure_speed(result, log=log)
    if result.holds:
        write_quant_sidecar(result, sidecar)
        log(f"wrote {sidecar} (usg run/serve/bench apply it; --fp32 ignores it)")
    if html_path:
        try:
            write_html(result, Path(html_path))
        except OSError as exc:
            raise InputError(
                f"--html {html_path!r}: cannot write the report ({exc.strerror or exc}); "
                "fix: pass a path in a writable folder"
            ) from None
        log(f"wrote {html_path}")
    if as_json:
        click.echo(json.dumps(result_json(result), indent=2))
    else:
        render_text(result, out_console)
    if not result.holds:
        err_console.print(
            f"error: the guard does not hold after {result.trials} quantization(s); no sidecar written; fix: raise "
            "--max-trials, loosen --guard, try --fallback op-types, or leave the models in the table above FP32"
        )
        sys.exit(1)


def _check_outputs(target: Path, html: Path | None) -> None:
    """The folder for the quantized files can be created and written, and the HTML report's folder exists."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / ".usg-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"--out {str(target)!r}: cannot write quantized models there ({exc.strerror or exc}); "
            "fix: pass --out with a writable folder"
        ) from None
    if html is not None and not html.parent.is_dir():
        raise UsageError(
            f"--html {str(html)!r}: folder {str(html.parent)!r} does not exist; fix: create it first, or name a file "
            "in an existing folder"
        )
