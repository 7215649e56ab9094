"""``usg init MODEL.onnx [--name N] [--dir DIR]``: a runnable graph for one model, with sample inputs."""

from __future__ import annotations

from pathlib import Path

import click

from usg.cli.common import err_console, escape, out_console
from usg.errors import UsageError

__all__ = ["init"]


def _kinds(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, kind = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--input-kind {pair!r} is not INPUT=KIND; fix: e.g. --input-kind pixel_values=image")
        out[name] = kind
    return out


@click.command("init")
@click.argument("model", metavar="MODEL.onnx", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="Graph name (also names the files) [default: the model file's stem].")
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder to write NAME.yaml, NAME_ops.py and NAME_samples/ into.",
)
@click.option(
    "--input-kind",
    "kinds",
    multiple=True,
    metavar="INPUT=KIND",
    help="Treat a model input as image, text or tensor (default: guessed from dtype, shape and name).",
)
@click.option("--tokenizer", metavar="PATH", help="A tokenizer.json for text inputs (else a stub tokenizer).")
@click.option("--force", is_flag=True, help="Overwrite files a previous `usg init` wrote.")
def init(
    model: Path, name: str | None, out_dir: Path, kinds: tuple[str, ...], tokenizer: str | None, force: bool
) -> None:
    """Write a runnable graph for MODEL.onnx: inputs and outputs read from the model, a
    pre-processing stub for image and text inputs, and a sample input for each.

    `usg run` works on the result at once (the command is printed); then edit the stubs.
    """
    from usg.cli.scaffold import write_scaffold

    if tokenizer is None and (model.parent / "tokenizer.json").is_file():
        tokenizer = str((model.parent / "tokenizer.json").resolve())
    elif tokenizer is not None and not tokenizer.startswith("pkg://"):
        if not Path(tokenizer).is_file():
            raise UsageError(f"--tokenizer {tokenizer}: no such file; fix: pass a tokenizer.json or pkg://PACKAGE/FILE")
        tokenizer = str(Path(tokenizer).resolve())  # the graph resolves paths from its own folder
    with err_console.status(escape(f"reading {model} (and probing the image sizes it accepts)")):
        done = write_scaffold(
            model, out_dir, name or model.stem, kinds_override=_kinds(kinds), tokenizer=tokenizer, force=force
        )
    out_console.print(f"wrote {escape(str(done.graph))}")
    if done.ops is not None:
        out_console.print(f"wrote {escape(str(done.ops))} (pre-processing stubs: edit them for your model)")
    for gin, value in done.samples.items():
        out_console.print(f"sample {escape(gin)}: {escape(value)}")
    out_console.print(f"run it:  {escape(done.run_command())}")
