"""``usg bench TARGET`` and ``usg tune GRAPH``: thin wrappers over :mod:`usg.bench`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from usg.cli.common import FiniteFloatRange, err_console, escape, load_graph_for_cli, out_console
from usg.errors import UsageError

__all__ = ["bench", "tune"]


def _int_list(value: str, option: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise UsageError(
            f"{option} {value!r}: not a comma-separated list of integers; fix: e.g. {option} 1,8,32"
        ) from None
    if not out or any(v < 1 for v in out):
        raise UsageError(f"{option} {value!r}: values must be ≥ 1; fix: e.g. {option} 1,8,32")
    return out


@click.command()
@click.argument("target")
@click.option("--concurrency", "-c", default="1,8,32", show_default=True, help="Closed loop: clients, comma-separated.")
@click.option("--rate", type=FiniteFloatRange(min=0.01), help="Open loop: Poisson arrivals per second (instead of -c).")
@click.option(
    "--duration", default=10.0, show_default=True, type=FiniteFloatRange(min=0.5), help="Measured seconds per run."
)
@click.option(
    "--warmup", default=2.0, show_default=True, type=FiniteFloatRange(min=0.0), help="Unmeasured seconds first."
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Repeat every run, alternating system order (fairer on a shared machine).",
)
@click.option(
    "--inputs",
    "inputs_path",
    help="Images and/or .txt files (a folder or one file); default: rendered documents + texts.",
)
@click.option("--compare", default="", help="Baselines: sequential,http-stitched,ray-serve,rapidocr.")
@click.option(
    "--graph",
    "graph_path",
    help="With a URL TARGET: the graph the server runs (for --compare and the model-only bound).",
)
@click.option(
    "--repeat-rate",
    type=FiniteFloatRange(0.0, 1.0),
    default=None,
    help="Send this share of repeated inputs (the rest never seen before) and turn USG's node cache on.",
)
@click.option("--untuned", is_flag=True, help="Ignore GRAPH.tuned.yaml (written by `usg tune`).")
@click.option(
    "--bound-sidecar",
    "bound_sidecar",
    type=click.Path(exists=True, dir_okay=False),
    help="Measure the model-only bound with this `usg tune` sidecar's settings; the graph under test "
    "stays as loaded (e.g. the graph as written, with --untuned or no sidecar next to it).",
)
@click.option("--fp32", is_flag=True, help="Ignore GRAPH.quant.yaml (written by `usg quantize`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--plot", "plot_dir", type=click.Path(file_okay=False), help="Write latency_cdf.png and throughput.png here."
)
def bench(
    target: str,
    concurrency: str,
    rate: float | None,
    duration: float,
    warmup: float,
    rounds: int,
    inputs_path: str | None,
    compare: str,
    graph_path: str | None,
    repeat_rate: float | None,
    untuned: bool,
    as_json: bool,
    plot_dir: str | None,
    fp32: bool = False,
    bound_sidecar: str | None = None,
) -> None:
    """Benchmark TARGET (a graph file, run in process, or the URL of a `usg serve`) against baselines."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from usg.bench.baselines import BASELINES
    from usg.bench.runner import BenchConfig, run_bench
    from usg.bench.samples import default_samples, load_samples
    from usg.bench.targets import is_url

    levels = _int_list(concurrency, "--concurrency")
    systems = tuple(s.strip() for s in compare.split(",") if s.strip())
    unknown = [s for s in systems if s not in BASELINES]
    if unknown:
        raise UsageError(
            f"--compare {','.join(unknown)}: unknown baseline; fix: use one or more of {', '.join(BASELINES)}"
        )
    graph = _graph(target, graph_path, untuned, fp32)
    samples = load_samples(inputs_path, graph) if inputs_path else default_samples(graph)
    cfg = BenchConfig(
        target, levels, rate, duration, warmup, systems, samples=samples, rounds=rounds, repeat_rate=repeat_rate
    )
    if is_url(target) and graph is None and systems:
        raise UsageError("--compare with a URL target needs --graph GRAPH (the graph the server runs)")

    def log(msg: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{escape(msg)}[/]")

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=as_json,
    ) as progress:

        def factory(system: str, level: str, total: float) -> Any:
            task = progress.add_task(f"{system} @ {level}", total=1.0)
            return lambda frac: progress.update(task, completed=frac)

        with _stdout_to_stderr(as_json):  # Ray's raylet prints to fd 1; keep --json output clean
            notes: list[str] = []
            meter = _bound_meter(graph, samples, notes, Path(bound_sidecar) if bound_sidecar else None, untuned)
            report = asyncio.run(run_bench(cfg, graph, progress=factory, log=log, bound=meter))
            report.notes.extend(notes)
    if plot_dir:
        from usg.bench.plots import write_plots

        for p in write_plots(report, plot_dir):
            err_console.print(f"wrote {escape(str(p))}")
    if as_json:
        from usg.bench.report import report_json

        click.echo(json.dumps(report_json(report), indent=2))
    else:
        from usg.bench.report import render_report

        render_report(report, out_console)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Point file descriptor 1 at stderr for the block (child processes print there), if it is real."""
    try:
        fd = sys.stdout.fileno() if active else -1
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd != 1:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _graph(target: str, graph_path: str | None, untuned: bool, fp32: bool = False) -> Any:
    from usg.bench.targets import is_url

    path = graph_path or (None if is_url(target) else target)
    if path is None:
        return None
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such graph file; fix: pass a graph YAML, or a http:// URL of `usg serve`")
    return load_graph_for_cli(path, tuned=not untuned, quantized=not fp32)


def _bound_meter(
    graph: Any, samples: list[Any], report_notes: list[str], sidecar: Path | None = None, untuned: bool = False
) -> Any:
    """A model-only bound meter: from ``sidecar`` when given (the graph under test is not changed),
    else from the tune sidecar next to the graph unless ``untuned`` (else a note and None)."""
    from usg.bench.bound import BoundMeter
    from usg.graph.sidecar import sidecar_path

    if graph is None:
        if sidecar is not None:
            raise UsageError("--bound-sidecar needs the graph: with a URL TARGET pass --graph GRAPH as well")
        return None
    if sidecar is not None:
        return BoundMeter(graph, sidecar, samples)
    if untuned or graph.source is None:
        return None
    path = sidecar_path(graph.source)
    if not path.is_file():
        report_notes.append(
            f"no model-only bound: run `usg tune` on a copy of {graph.source} and pass its sidecar with "
            f"--bound-sidecar COPY/{path.name} (or run `usg tune {graph.source}`, which writes {path.name} "
            "next to the graph and makes `usg bench` run the tuned graph)"
        )
        return None
    return BoundMeter(graph, path, samples)


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--p95-ms",
    default=100.0,
    show_default=True,
    type=FiniteFloatRange(min=0.1),
    help="Latency bound for one model batch.",
)
@click.option("--batch-sizes", default="1,2,4,6,8,12,16", show_default=True, help="Batch sizes to profile.")
@click.option("--threads", "threads_opt", default="", help="Intra-op thread counts (default: 1 … CPU count).")
@click.option("--seconds", default=1.0, show_default=True, type=FiniteFloatRange(min=0.05), help="Time per config.")
@click.option(
    "--inputs", "inputs_path", help="Sample inputs to capture model items from (default: rendered documents)."
)
@click.option("--models", "only", default="", help="Profile only these models (comma-separated).")
@click.option("--dry-run", is_flag=True, help="Print the choice; do not write GRAPH.tuned.yaml.")
@click.option("--json", "as_json", is_flag=True, help="Print profile and choices as JSON.")
def tune(
    graph_path: str,
    p95_ms: float,
    batch_sizes: str,
    threads_opt: str,
    seconds: float,
    inputs_path: str | None,
    only: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Profile each ONNX model across batch sizes and threads; write GRAPH.tuned.yaml."""
    import os

    from rich.table import Table

    from usg.bench.samples import default_samples, load_samples
    from usg.bench.tune import (
        MAX_BATCH_BYTES,
        capture_items,
        choose,
        items_per_request,
        profile_model,
        write_sidecar,
    )
    from usg.graph.sidecar import sidecar_path

    graph = load_graph_for_cli(graph_path, tuned=False)  # profile from the graph as written
    sizes = _int_list(batch_sizes, "--batch-sizes")
    threads = _int_list(threads_opt, "--threads") if threads_opt else tuple(range(1, (os.cpu_count() or 1) + 1))
    wanted = {m.strip() for m in only.split(",") if m.strip()}
    onnx = sorted(n for n, m in graph.models.items() if m.backend == "onnxruntime")  # what capture_items records
    bad = sorted(wanted - set(onnx))
    if bad:
        # a tokenizer (or an engine) model was accepted and then reported as "every batch takes over 1 GiB"
        what = "not an ONNX model of the graph" if set(bad) <= set(graph.models) else "not in the graph"
        raise UsageError(
            f"--models {','.join(bad)}: {what}; fix: use some of {', '.join(onnx) or '(none)'} "
            "(usg tune profiles the ONNX Runtime models)"
        )
    samples = load_samples(inputs_path, graph) if inputs_path else default_samples(graph)
    log = (lambda _m: None) if as_json else (lambda m: err_console.print(f"[dim]{escape(m)}[/]"))
    log(f"capturing model inputs from {len(samples)} sample request(s)")
    items, requests = capture_items(graph, samples)
    per_request = items_per_request(items, requests)
    profiles: dict[str, list[Any]] = {}
    choices: dict[str, Any] = {}
    for name, recorded in items.items():
        if wanted and name not in wanted:
            continue
        points = profile_model(
            graph.models[name],
            recorded,
            batch_sizes=sizes,
            threads=threads,
            p95_ms=p95_ms,
            seconds_per_point=seconds,
            progress=log,
        )
        if points:
            profiles[name] = points
            choices[name] = choose(points, p95_ms)
    if not profiles:
        if wanted and not wanted & items.keys():
            why = f"the sample requests reached none of --models {','.join(sorted(wanted))}"
        elif items:
            why = f"every --batch-sizes value makes a batch whose inputs take over {MAX_BATCH_BYTES // 2**30} GiB"
        else:
            why = "the graph has no ONNX model whose inputs the sample requests reached"
        raise UsageError(f"nothing was profiled: {why}; fix: pass smaller --batch-sizes, or other --inputs/--models")
    out_path = sidecar_path(graph_path)
    doc = None if dry_run else write_sidecar(graph, choices, profiles, per_request, p95_ms, out_path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "items_per_request": per_request,
                    "profiles": {m: [p.to_json() for p in pts] for m, pts in profiles.items()},
                    "choices": {
                        m: {"batch": c.batch, "threads": c.threads, "reason": c.reason} for m, c in choices.items()
                    },
                    "sidecar": None if doc is None else str(out_path),
                },
                indent=2,
            )
        )
        return
    table = Table(title=escape(f"usg tune {graph_path} (p95 bound {p95_ms:g} ms per batch)"))
    for col in ("model", "threads", "batch", "p50 ms", "p95 ms", "items/s", "CPU ms/item", ""):
        table.add_column(col, justify="left" if col in ("model", "") else "right")
    for name, points in profiles.items():
        c = choices[name]
        for p in points:
            mark = "◀ chosen" if (p.batch, p.threads) == (c.batch, c.threads) else ""
            table.add_row(
                name,
                str(p.threads),
                str(p.batch),
                f"{p.p50_ms:.1f}",
                f"{p.p95_ms:.1f}",
                f"{p.items_per_s:.1f}",
                f"{p.core_ms_per_item:.2f}",
                mark,
            )
        table.add_section()
    out_console.print(table)
    for name, c in choices.items():
        out_console.print(
            f"{name}: batch {c.batch}, {c.threads} thread(s) — {c.reason}; {per_request.get(name, 0):.2f} items/request"
        )
    if doc is not None:
        out_console.print(f"wrote {escape(str(out_path))} (usg bench applies it; delete it to undo)")
