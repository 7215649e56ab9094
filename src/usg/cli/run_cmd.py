"""``usg run GRAPH --input NAME=VALUE ... [--json]``."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.table import Table

from usg.cli.common import GRAPH_FILE, FiniteFloatRange, err_console, escape, load_graph_for_cli, out_console
from usg.errors import InputError, PayloadTooLarge, UsageError
from usg.graph import Graph
from usg.npy import load_npy
from usg.runtime import Executor, InferResult
from usg.runtime.events import ExecutionEvent, NodeFinished, TokenDelta
from usg.runtime.inputs import DEFAULT_MAX_TEXT_CHARS, ITEM_KEYS, graph_limit
from usg.specs import Modality

__all__ = ["parse_inputs", "run"]


def parse_inputs(graph: Graph, pairs: tuple[str, ...]) -> dict[str, Any]:
    """``image=PATH``, ``audio=PATH``, ``text=STRING`` (``text=@FILE`` reads a file), ``tensor=FILE.npy``;
    a timestamped input takes ``PATH@MS,PATH@MS,...`` (capture times in ms).

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
        if d.timestamped:
            out[name] = _stamped_files(name, d.modality, value, graph)
            continue
        if d.modality is not Modality.TEXT and not Path(value).exists():
            raise UsageError(f"--input {name}={value}: file {value!r} does not exist; fix: pass an existing file")
        if d.modality is Modality.TEXT:
            out[name] = _text_file(name, value[1:], graph) if value.startswith("@") else value
        elif d.modality in (Modality.IMAGE, Modality.AUDIO):
            out[name] = Path(value)
        else:
            try:
                out[name] = load_npy(Path(value))
            except (OSError, ValueError) as exc:
                raise InputError(
                    f"{name}: {value!r} is not a .npy array ({exc})",
                    field=name,
                    fix="save the tensor with numpy.save",
                ) from None
    return out


def _text_file(name: str, path: str, graph: Graph) -> str:
    """``text=@FILE``: the file's UTF-8 text, read no further than ``limits.max_text_chars`` allows
    (4 bytes a character), so ``@/dev/zero`` or a multi-GB file is refused without filling memory."""
    limit = int(graph_limit(graph.limits, "max_text_chars", DEFAULT_MAX_TEXT_CHARS))
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(4 * limit + 1)
    except OSError as exc:
        raise InputError(
            f"{name}: cannot read {path!r}: {exc.strerror}", field=name, fix="pass an existing UTF-8 text file after @"
        ) from None
    if len(data) > 4 * limit:
        raise PayloadTooLarge(
            f"{name}: file {path!r} holds more than {4 * limit} bytes, more than the graph's limit of {limit} "
            "characters (limits.max_text_chars) can hold",
            field=name,
            fix="pass a shorter text (split a long document), or raise limits.max_text_chars in the graph",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{name}: file {path!r} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})",
            field=name,
            fix="convert it to UTF-8, e.g. iconv -f LATIN1 -t UTF-8 FILE > OUT.txt",
        ) from None


def _stamped_files(name: str, modality: Modality, value: str, graph: Graph) -> list[dict[str, Any]]:
    """``PATH@MS,PATH@MS,...`` → timestamped items ``{image|audio|...: bytes, ts_ms: MS}`` (files read here)."""
    key = ITEM_KEYS[modality]
    items = []
    for part in value.split(","):
        path, sep, ms = part.strip().rpartition("@")
        try:
            ts = float(ms)
        except ValueError:
            ts = float("nan")
        if not sep or not path or ts != ts:
            raise UsageError(
                f"--input {name}={value}: {part!r} is not PATH@MS; "
                f"fix: write --input {name}=slide1.png@0,slide2.png@5000 (capture times in ms)"
            )
        if not Path(path).is_file():
            raise UsageError(f"--input {name}=...: file {path!r} does not exist; fix: pass an existing file")
        items.append(
            {
                key: Path(path).read_bytes() if modality is not Modality.TEXT else _text_file(name, path, graph),
                "ts_ms": ts,
            }
        )
    return items


class _TokenPrinter:
    """``usg run --stream``: token deltas written as they arrive (to stdout, or to stderr when
    stdout carries the one JSON object), each LLM node under its own header; nodes to stderr."""

    def __init__(self, as_json: bool) -> None:
        self.out = sys.stderr if as_json else sys.stdout
        self.as_json = as_json
        self.node: str | None = None
        self.streamed: set[str] = set()

    def __call__(self, event: ExecutionEvent) -> None:
        if isinstance(event, TokenDelta):
            if event.node != self.node:
                self.end_line()
                self.out.write(f"[{event.node}] ")
                self.node = event.node
                self.streamed.add(event.node)
            self.out.write(event.text)
            self.out.flush()
        elif isinstance(event, NodeFinished) and not self.as_json:
            if event.node == self.node:
                self.end_line()
            err_console.print(f"[dim]{escape(event.node)} finished in {event.ms:.1f} ms[/]")

    def end_line(self) -> None:
        if self.node is not None:
            self.out.write("\n")
            self.out.flush()
            self.node = None


def _render(result: InferResult, streamed: Collection[str] = ()) -> None:
    for name, value in result.outputs.items():
        if name in streamed:
            continue  # its text was printed as it arrived
        if name == "lines" and isinstance(value, list) and all(_is_ocr_line(v) for v in value):
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
            out_console.print(_array_line(name, value))
        elif isinstance(value, dict) and "best_line" in value:
            out_console.print(_relevance_line(name, value))
        else:
            out_console.print(f"[bold]{escape(name)}[/]: {escape(repr(value))}")
    if result.pruned_nodes:
        out_console.print(f"[dim]pruned: {escape(', '.join(result.pruned_nodes))}[/]")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result.node_ms.items())
    out_console.print(f"[dim]node ms¹: {escape(timings)}[/]")
    out_console.print(f"[dim]{NODE_MS_NOTE}[/]")


def _is_ocr_line(line: object) -> bool:
    """An item of the OCR examples' ``lines`` output (text, score, a 4-point box), printed as a table row."""
    if not isinstance(line, dict) or not isinstance(line.get("score"), (int, float)):
        return False
    box = line.get("box")
    points = isinstance(box, list) and len(box) >= 3 and all(isinstance(p, (list, tuple)) and len(p) >= 2 for p in box)
    return "text" in line and points


def _array_line(name: str, value: np.ndarray[Any, Any]) -> str:
    """One line for an array output: dtype, shape, its first values and, for numbers, the first row's norm."""
    flat = value.reshape(-1)[:6]
    shape = escape(str(list(value.shape)))
    if value.dtype.kind in "biuf":
        head = ", ".join(f"{v:.4f}" for v in flat.astype(np.float64))
        norm = float(np.linalg.norm(value.reshape(value.shape[0] if value.ndim else 1, -1)[0])) if value.size else 0.0
        return f"[bold]{escape(name)}[/]: {value.dtype}{shape}  {escape(f'[{head}, …]')}  ‖row0‖={norm:.4f}"
    head = ", ".join(repr(v if len(str(v)) <= 40 else f"{str(v)[:40]}…") for v in flat.tolist())
    return f"[bold]{escape(name)}[/]: {value.dtype}{shape}  {escape(f'[{head}, …]')}"


NODE_MS_NOTE = (
    "¹ node_ms: each node's wall time in milliseconds, from the moment its inputs were ready to its "
    "outputs, including the wait in its model's queue and batch window (a map node: all its items). "
    "Nodes on parallel branches overlap, so the times do not add up to the request's; nodes answered "
    "from the node cache are not listed; the first request of a process is slower (first calls of "
    "each model)."
)


def _relevance_line(name: str, value: dict[str, Any]) -> str:
    """``relevance`` of the document example: query↔document cosine and the best-matching line."""
    best = value.get("best_line")
    text = f"[bold]{escape(name)}[/]: query↔document cosine {value.get('document')}"
    if isinstance(best, dict):
        text += f"; best line #{best.get('index')} {escape(repr(best.get('text')))} (cosine {best.get('score')})"
    scores = value.get("lines")
    if isinstance(scores, list):
        text += f"; per line {escape(str(scores))}"
    return text


@click.command("run")
@click.argument("graph_path", metavar="GRAPH", type=GRAPH_FILE)
@click.option(
    "--input",
    "-i",
    "inputs",
    multiple=True,
    metavar="NAME=VALUE",
    help="A graph input: image=PATH, audio=PATH, text=STRING or text=@FILE, tensor=FILE.npy; "
    "a timestamped input: frames=a.png@0,b.png@5000 (ms). Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Request deadline in seconds (> 0).",
)
@click.option("--no-batching", is_flag=True, help="One backend call per item (ignore batch policies).")
@click.option("--fp32", is_flag=True, help="Ignore GRAPH.quant.yaml (written by `usg quantize`).")
@click.option(
    "--stream",
    is_flag=True,
    help="Print LLM tokens as they arrive (to stderr with --json, whose stdout stays one JSON object).",
)
def run(
    graph_path: str, inputs: tuple[str, ...], as_json: bool, timeout: float, no_batching: bool, fp32: bool, stream: bool
) -> None:
    """Push inputs through a graph and print its outputs."""
    graph = load_graph_for_cli(graph_path, quantized=not fp32)
    values = parse_inputs(graph, inputs)
    executor = Executor(graph, batching=not no_batching, timeout_s=timeout)
    printer = _TokenPrinter(as_json)
    try:
        if not as_json:
            with err_console.status("loading models"):
                executor.start_sync()
        if stream:
            result = executor.stream_sync(values, printer)
            printer.end_line()
        else:
            result = executor.infer_sync(values)
    finally:
        executor.close()
    if as_json:
        click.echo(json.dumps(result.to_json_dict(), ensure_ascii=False))
    else:
        streamed = {o for o, ref in graph.outputs.items() if not ref.is_graph_input and ref.source in printer.streamed}
        _render(result, streamed)
