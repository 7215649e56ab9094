"""``usg graph show GRAPH [--modalities image,text] [--engine ray] [--format text|mermaid|dot|svg|png]``."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table
from rich.tree import Tree

from usg.cli.common import GRAPH_FILE, err_console, escape, load_graph_quiet, out_console
from usg.cli.graph_picture import FORMATS, render_picture
from usg.errors import UsageError
from usg.graph import Graph, describe_model
from usg.runtime.request import plan_request

__all__ = ["graph"]


@click.group("graph")
def graph() -> None:
    """Inspect a graph: nodes, edges, specs, pruning."""


@graph.command("show")
@click.argument("graph_path", metavar="GRAPH", type=GRAPH_FILE)
@click.option(
    "--modalities",
    "-m",
    default=None,
    help="Comma-separated modalities (or input names) present in a request; shows what runs.",
)
@click.option(
    "--engine",
    type=click.Choice(["embedded", "ray"]),
    default="embedded",
    show_default=True,
    help="ray: also list the Ray Serve deployments `usg serve --engine ray` would create (from deploy:).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", *FORMATS]),
    default="text",
    show_default=True,
    help="text: tables; mermaid/dot: a diagram's source; svg/png: a picture (Graphviz `dot`).",
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write the picture to this file [default: stdout]."
)
def show(graph_path: str, modalities: str | None, engine: str, fmt: str, output: str | None) -> None:
    """Print inputs, models, nodes with their wiring and specs, outputs, and pruning — or a picture."""
    g = load_graph_quiet(graph_path)
    if fmt != "text":
        _write_picture(g, fmt, output)
        return
    _print_tables(g)
    if engine == "ray":
        _print_ray_plan(g)
    if modalities is not None:
        _print_pruning(g, modalities)


def _write_picture(g: Graph, fmt: str, output: str | None) -> None:
    data = render_picture(g, fmt)
    if output is None:
        if fmt in ("svg", "png") and sys.stdout.isatty():
            raise UsageError(f"--format {fmt} writes binary data; fix: add --output FILE.{fmt}")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        Path(output).write_bytes(data)
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write ({exc.strerror}); fix: pass a writable path") from None
    err_console.print(f"wrote {escape(output)} ({len(data)} bytes)")


def _print_tables(g: Graph) -> None:
    out_console.print(f"[bold]graph[/] {escape(g.name)}  ({len(g.nodes)} nodes, {len(g.models)} models)")
    inputs = Table(title="inputs")
    for col in ("name", "modality", "spec", "optional"):
        inputs.add_column(col)
    for d in g.inputs.values():
        inputs.add_row(
            escape(d.name),
            d.modality.value,
            escape(d.spec.describe()) if d.spec else "-",
            "yes" if d.optional else "no",
        )
    out_console.print(inputs)
    models = Table(title="models")
    for col in ("name", "backend", "inputs", "outputs", "batch"):
        models.add_column(col)
    for m in g.models.values():
        io = describe_model(m)
        ins = "\n".join(f"{k}: {v.describe()}" for k, v in io[0].items()) if io else "?"
        outs = "\n".join(f"{k}: {v.describe()}" for k, v in io[1].items()) if io else "?"
        b = m.batch
        batch = f"max {b.max_size}, {b.max_delay_ms:g} ms" + (", pad" if b.pad else "") if b.enabled else "off"
        models.add_row(escape(m.name), escape(m.backend), escape(ins), escape(outs), batch)
    out_console.print(models)
    tree = Tree("[bold]nodes[/] (topological order)")
    for name in g.order:
        n = g.nodes[name]
        what = f"model {n.model}" if n.model else (n.align.describe() if n.align is not None else f"fn {n.fn}")
        branch = tree.add(
            f"{escape(name)}  [dim]{escape(what)}{escape('  map ' + ','.join(n.map) if n.map else '')}[/]"
        )
        for port, ref in n.inputs.items():
            branch.add(escape(f"{port} ← {ref}"))
    out_console.print(tree)
    out_console.print("[bold]outputs[/]: " + escape(", ".join(f"{k} ← {v}" for k, v in g.outputs.items())))


def _print_pruning(g: Graph, modalities: str) -> None:
    """What runs for a request with these modalities; an unknown one is an error after the graph is shown."""
    wanted = {m.strip() for m in modalities.split(",") if m.strip()}
    present = {n for n, d in g.inputs.items() if n in wanted or d.modality.value in wanted}
    unknown = wanted - {d.modality.value for d in g.inputs.values()} - set(g.inputs)
    if unknown:
        raise UsageError(
            f"--modalities: {', '.join(sorted(unknown))} matches no input of {g.name!r}; "
            f"fix: use input names or modalities of: "
            f"{', '.join(f'{n} ({d.modality.value})' for n, d in g.inputs.items())}"
        )
    runs, pruned = plan_request(g, present)
    missing_required = [n for n, d in g.inputs.items() if not d.optional and n not in present]
    out_console.print(f"[bold]with {escape(', '.join(sorted(present)) or 'no inputs')}[/]:")
    out_console.print(f"  runs:   {escape(', '.join(runs) or '(nothing)')}")
    out_console.print(f"  pruned: {escape(', '.join(pruned) or '(nothing)')}")
    produced = [o for o, r in g.outputs.items() if (r.source in runs) or (r.is_graph_input and r.port in present)]
    out_console.print(f"  outputs present: {escape(', '.join(produced) or '(none)')}")
    if missing_required:
        out_console.print(f"  [red]required inputs missing: {escape(', '.join(missing_required))}[/]")


def _print_ray_plan(g: Graph) -> None:
    from usg.scale.ray_options import deployment_plan

    table = Table(title="Ray Serve deployments (usg serve --engine ray, default --max-inflight)")
    for col in ("deployment", "runs", "replicas", "resources", "max_ongoing", "batch"):
        table.add_column(col)
    for d in deployment_plan(g):
        o = d.options
        auto = o.get("autoscaling_config")
        replicas = str(o.get("num_replicas"))
        if auto:
            target = auto.get("target_ongoing_requests")
            replicas = f"{auto['min_replicas']}-{auto['max_replicas']} auto" + (
                f", target {target:g}" if target else ""
            )
        res = ", ".join(f"{k.removeprefix('num_')} {v:g}" for k, v in o["ray_actor_options"].items())
        runs = d.target if d.kind != "router" else "HTTP API, graph logic" + "".join(f"\n{x}" for x in d.runs_in_router)
        batch = "-"
        if d.kind == "model":
            b = g.models[d.target].batch
            batch = f"@serve.batch {b.max_size}, {b.max_delay_ms:g} ms" if b.enabled else "off"
        table.add_row(escape(d.name), escape(runs), replicas, escape(res), str(o["max_ongoing_requests"]), batch)
    out_console.print(table)
