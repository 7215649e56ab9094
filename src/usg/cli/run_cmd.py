"""``usg run GRAPH --input NAME=VALUE ... [--json]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.table import Table

from usg.cli.common import GRAPH_FILE, err_console, escape, load_graph_for_cli, out_console
from usg.errors import InputError, UsageError
from usg.graph import Graph
from usg.runtime import Executor, InferResult
from usg.specs import Modality

__all__ = ["parse_inputs", "run"]


def parse_inputs(graph: Graph, pairs: tuple[str, ...]) -> dict[str, Any]:
    """``image=PATH``, ``audio=PATH``, ``text=STRING`` (``text=@FILE`` reads a file), ``tensor=FILE.npy``.

    Command-line mistakes (no input, an unknown or repeated name, a file that does not
    exist) raise :class:`UsageError` (exit code 2); a file that exists but is not what the
    input needs fails the request later or raises :class:`InputError` (exit code 1).
    """
    names = ", ".join(f"{n} ({d.modality.value})" for n, d in graph.inputs.items())
    if not pairs:
        raise UsageError(f"no --input given; fix: pass one or more of {names}, e.g. --input NAME=VALUE")
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--input {pair!r} is not NAME=VALUE; fix: write e.g. --input image=page.png")
        d = graph.inputs.get(name)
        if d is None:
            raise UsageError(
                f"--input {name}=...: graph {graph.name!r} has no input {name!r}; "
                f"fix: use one of {', '.join(sorted(graph.inputs))}"
            )
        if name in out:
            raise UsageError(
                f"--input {name}=... is given more than once; one request takes one value per input; "
                f"fix: pass {name} once (run `usg run` again, or `usg bench --inputs FOLDER` for many)"
            )
        if d.modality is not Modality.TEXT and not Path(value).exists():
            raise UsageError(f"--input {name}={value}: file {value!r} does not exist; fix: pass an existing file")
        if d.modality is Modality.TEXT:
            if value.startswith("@"):
                try:
                    value = Path(value[1:]).read_text(encoding="utf-8")
                except OSError as exc:
                    raise InputError(
                        f"{name}: cannot read {value[1:]!r}: {exc.strerror}",
                        field=name,
                        fix="pass an existing UTF-8 text file after @",
                    ) from None
            out[name] = value
        elif d.modality in (Modality.IMAGE, Modality.AUDIO):
            out[name] = Path(value)
        else:
            try:
                out[name] = np.load(Path(value), allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(
                    f"{name}: {value!r} is not a .npy array ({exc})",
                    field=name,
                    fix="save the tensor with numpy.save",
                ) from None
    return out


def _render(result: InferResult) -> None:
    for name, value in result.outputs.items():
        if name == "lines" and isinstance(value, list):
            table = Table(title=escape(f"{name} ({len(value)})"), show_lines=False)
            table.add_column("#", justify="right")
            table.add_column("text")
            table.add_column("score", justify="right")
            table.add_column("box (x0,y0 → x2,y2)")
            for i, line in enumerate(value):
                box = line["box"]
                table.add_row(
                    str(i),
                    escape(str(line["text"])),
                    f"{line['score']:.3f}",
                    f"{box[0][0]:.0f},{box[0][1]:.0f} → {box[2][0]:.0f},{box[2][1]:.0f}",
                )
            out_console.print(table)
        elif isinstance(value, np.ndarray):
            head = ", ".join(f"{v:.4f}" for v in value.reshape(-1)[:6])
            norm = float(np.linalg.norm(value.reshape(value.shape[0], -1), axis=1)[0]) if value.size else 0.0
            out_console.print(
                f"[bold]{escape(name)}[/]: {value.dtype}{escape(str(list(value.shape)))}  "
                f"{escape(f'[{head}, …]')}  ‖row0‖={norm:.4f}"
            )
        else:
            out_console.print(f"[bold]{escape(name)}[/]: {escape(repr(value))}")
    if result.pruned_nodes:
        out_console.print(f"[dim]pruned: {escape(', '.join(result.pruned_nodes))}[/]")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result.node_ms.items())
    out_console.print(f"[dim]node ms (wall time per node, queueing and batching included): {escape(timings)}[/]")


@click.command("run")
@click.argument("graph_path", metavar="GRAPH", type=GRAPH_FILE)
@click.option(
    "--input",
    "-i",
    "inputs",
    multiple=True,
    metavar="NAME=VALUE",
    help="A graph input: image=PATH, audio=PATH, text=STRING or text=@FILE, tensor=FILE.npy. Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Request deadline in seconds (> 0).",
)
@click.option("--no-batching", is_flag=True, help="One backend call per item (ignore batch policies).")
@click.option("--fp32", is_flag=True, help="Ignore GRAPH.quant.yaml (written by `usg quantize`).")
def run(graph_path: str, inputs: tuple[str, ...], as_json: bool, timeout: float, no_batching: bool, fp32: bool) -> None:
    """Push inputs through a graph and print its outputs."""
    graph = load_graph_for_cli(graph_path, quantized=not fp32)
    values = parse_inputs(graph, inputs)
    executor = Executor(graph, batching=not no_batching, timeout_s=timeout)
    try:
        if not as_json:
            with err_console.status("loading models"):
                executor.start_sync()
        result = executor.infer_sync(values)
    finally:
        executor.close()
    if as_json:
        click.echo(json.dumps(result.to_json_dict(), ensure_ascii=False))
    else:
        _render(result)
