"""``usg doctor parity``: PyTorch vs ONNX Runtime on many shapes, not only the export's dummy one."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from usg.cli.common import FiniteFloatRange
from usg.cli.doctor_logs_cmd import exit_code, render_findings
from usg.errors import UsageError

__all__ = ["parity"]


def _parse_sizes(items: tuple[str, ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        sym, eq, vals = item.partition("=")
        try:
            out[sym.strip()] = [int(v) for v in vals.split(",") if v.strip()]
        except ValueError as exc:
            raise UsageError(f"--sizes {item!r}: sizes must be integers; fix: --sizes seq=4,16,33") from exc
        if not eq or not out[sym.strip()]:
            raise UsageError(f"--sizes {item!r} is not 'symbol=n,n,n'; fix: --sizes seq=4,16,33")
        if any(v < 1 for v in out[sym.strip()]):
            raise UsageError(f"--sizes {item!r}: sizes must be at least 1; fix: --sizes seq=4,16,33")
    return out


@click.command("parity")
@click.option("--torch", "torch_spec", required=True, help="module:factory or path/to/file.py:factory.")
@click.option("--onnx", "onnx_path", type=click.Path(dir_okay=False, path_type=Path), help="ONNX file to check.")
@click.option(
    "--dynamic-axes",
    help="Dynamic axes: 'input_ids:0=batch,1=seq;attention_mask:0=batch,1=seq' or torch-style JSON. "
    "Default: axis 0 of every input (or the ONNX file's symbolic dims).",
)
@click.option("--exporter", type=click.Choice(["auto", "legacy", "dynamo"]), default="auto", show_default=True)
@click.option("--opset", type=int, help="Opset to export with (default: the exporter's).")
@click.option("--atol", type=FiniteFloatRange(min=0), default=1e-4, show_default=True)
@click.option("--rtol", type=FiniteFloatRange(min=0), default=1e-3, show_default=True)
@click.option("--sizes", multiple=True, help="Sizes for one symbol, e.g. --sizes seq=4,16,33 (repeatable).")
@click.option("--save-onnx", type=click.Path(file_okay=False, path_type=Path), help="Keep the exported file here.")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "html", "sarif"]), default="text", show_default=True
)
def parity(
    torch_spec: str,
    onnx_path: Path | None,
    dynamic_axes: str | None,
    exporter: str,
    opset: int | None,
    atol: float,
    rtol: float,
    sizes: tuple[str, ...],
    save_onnx: Path | None,
    fmt: str,
) -> None:
    """Run a PyTorch model and its ONNX export on batch 1, 2, 7 and 3 sizes of every dynamic axis.

    Reports frozen shapes (naming the node holding the constant), numeric drift (naming the
    first diverging module/node) and classified exporter failures.
    """
    from usg.doctor.parity.export import parse_dynamic_axes
    from usg.doctor.parity.run import run_parity

    if onnx_path is not None and not onnx_path.is_file():
        raise UsageError(f"--onnx {str(onnx_path)!r} does not exist; fix: give an existing .onnx file")
    if save_onnx is not None:
        save_onnx.mkdir(parents=True, exist_ok=True)
    report = run_parity(
        torch_spec,
        onnx_path,
        parse_dynamic_axes(dynamic_axes),
        exporter=exporter,
        opset=opset,
        atol=atol,
        rtol=rtol,
        sizes=_parse_sizes(sizes),
        workdir=save_onnx,
    )
    lines = [
        f"{c.label:<24} {'ok ' if c.passed else 'BAD'} max_abs={[f'{e:.3g}' for e in c.max_abs_err]} "
        + (c.onnx_error or c.torch_error or c.mismatch or "")[:160]
        for c in report.cases
    ]
    render_findings(report.findings, fmt, {f"shapes (exporter: {report.exporter})": "\n".join(lines)})
    sys.exit(exit_code(report.findings))
