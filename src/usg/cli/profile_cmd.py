"""``usg profile GRAPH --inputs DIR -o ref.json``: the reference profile for drift monitoring."""

from __future__ import annotations

from pathlib import Path

import click

from usg.cli.common import err_console, load_graph_for_cli

__all__ = ["profile"]


@click.command("profile")
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option(
    "--inputs",
    "inputs_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder of sample inputs (images, .txt, .wav, .npy, .jsonl; files with one stem form one request).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
def profile(graph_path: str, inputs_dir: str, output: str) -> None:
    """Record per-input modality statistics and watched output distributions, with graph and model SHA-256."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from usg.monitor.profile import build_profile, write_profile

    graph = load_graph_for_cli(graph_path)
    with Progress(
        TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console
    ) as bar:
        task = bar.add_task("profile", total=None)

        def step(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        doc = build_profile(graph, Path(inputs_dir), progress=step)
    write_profile(doc, Path(output))
    for line in doc["failed"][:5]:
        err_console.print(f"[yellow]skipped[/] {line}")
    summary = ", ".join(f"{name} ({d['modality']}: {d['count']})" for name, d in doc["inputs"].items())
    outs = ", ".join(f"{n} ({o['kind']}: {o['count']})" for n, o in doc["outputs"].items()) or "none"
    err_console.print(f"profile of {doc['count']} request(s) → {output}\n  inputs: {summary}\n  outputs: {outs}")
