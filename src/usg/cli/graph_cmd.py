"""``usg graph show GRAPH [--modalities image,text]``."""

from __future__ import annotations

import click
from rich.table import Table
from rich.tree import Tree

from usg.cli.common import out_console
from usg.errors import UsageError
from usg.graph import Graph, describe_model, load_graph
from usg.runtime.executor import plan_request

__all__ = ["graph"]


@click.group("graph")
def graph() -> None:
    """Inspect a graph: nodes, edges, specs, pruning."""


@graph.command("show")
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
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
def show(graph_path: str, modalities: str | None, engine: str) -> None:
    """Print inputs, models, nodes with their wiring and specs, outputs, and pruning."""
    g = load_graph(graph_path)
    out_console.print(f"[bold]graph[/] {g.name}  ({len(g.nodes)} nodes, {len(g.models)} models)")
    inputs = Table(title="inputs")
    for col in ("name", "modality", "spec", "optional"):
        inputs.add_column(col)
    for d in g.inputs.values():
        inputs.add_row(d.name, d.modality.value, d.spec.describe() if d.spec else "-", "yes" if d.optional else "no")
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
        models.add_row(m.name, m.backend, ins, outs, batch)
    out_console.print(models)
    tree = Tree("[bold]nodes[/] (topological order)")
    for name in g.order:
        n = g.nodes[name]
        what = f"model {n.model}" if n.model else f"fn {n.fn}"
        branch = tree.add(f"{name}  [dim]{what}{'  map ' + ','.join(n.map) if n.map else ''}[/]")
        for port, ref in n.inputs.items():
            branch.add(f"{port} ← {ref}")
    out_console.print(tree)
    out_console.print("[bold]outputs[/]: " + ", ".join(f"{k} ← {v}" for k, v in g.outputs.items()))
    if engine == "ray":
        _print_ray_plan(g)
    if modalities is not None:
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
        out_console.print(f"[bold]with {', '.join(sorted(present)) or 'no inputs'}[/]:")
        out_console.print(f"  runs:   {', '.join(runs) or '(nothing)'}")
        out_console.print(f"  pruned: {', '.join(pruned) or '(nothing)'}")
        produced = [o for o, r in g.outputs.items() if (r.source in runs) or (r.is_graph_input and r.port in present)]
        out_console.print(f"  outputs present: {', '.join(produced) or '(none)'}")
        if missing_required:
            out_console.print(f"  [red]required inputs missing: {', '.join(missing_required)}[/]")


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
        table.add_row(d.name, runs, replicas, res, str(o["max_ongoing_requests"]), batch)
    out_console.print(table)
