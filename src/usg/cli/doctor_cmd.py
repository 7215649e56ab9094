"""``usg doctor``: check ONNX models, Triton repositories, graphs and HF model dirs.

``usg doctor parity ...`` and ``usg doctor logs FILE|-`` are dispatched to their
own commands (``usg.cli.doctor_parity_cmd`` / ``usg.cli.doctor_logs_cmd``).
Exit codes: 0 no errors, 1 errors found, 2 usage or I/O problem.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from usg.cli import fail
from usg.errors import MissingDependency, UsageError

__all__ = ["doctor"]

# first argument -> "module:attribute" of a click command
SUBCOMMANDS: dict[str, str] = {
    "parity": "usg.cli.doctor_parity_cmd:parity",
    "logs": "usg.cli.doctor_logs_cmd:logs",
}
_PROGRESS_MIN_TARGETS = 8
_SUB_KEY = "usg_doctor_sub"


class _DoctorCommand(click.Command):
    """A command whose first argument may name a sub-command (parity, logs)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] in SUBCOMMANDS:
            ctx.meta[_SUB_KEY] = (args[0], list(args[1:]))
            return []
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        sub = ctx.meta.get(_SUB_KEY)
        if sub is None:
            return super().invoke(ctx)
        name, rest = sub
        module_name, attr = SUBCOMMANDS[name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            click.echo(
                f"error: `usg doctor {name}` is not available in this build (module {module_name} is not installed)",
                err=True,
            )
            ctx.exit(2)
        cmd = getattr(module, attr)
        # parent=ctx.parent keeps the usage line "usg doctor logs ...", not "usg doctor [PATHS]... logs"
        with cmd.make_context(f"{ctx.info_name} {name}", rest, parent=ctx.parent) as sub_ctx:
            return cmd.invoke(sub_ctx)


def _list_checks() -> str:
    from usg.doctor.registry import all_codes
    from usg.doctor.runner import CHECK_MODULES, CODE_DOC_MODULES, load_check_modules

    load_check_modules(CHECK_MODULES + CODE_DOC_MODULES)
    lines = []
    for c in all_codes():
        lines.append(f"{c.code:<10} {c.severity.value:<8} {c.root_cause.value:<20} {c.title}")
        lines.append(f"{'':<10} {c.explanation}")
    return "\n".join(lines) + "\n"


def _progress() -> tuple[Any, Any]:
    """(rich Progress, callback) drawing on stderr when there are many targets; (None, None) off a tty."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("checking"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("", total=None)

    def update(i: int, total: int, target: Any) -> None:
        if i == 0 and total >= _PROGRESS_MIN_TARGETS:
            progress.start()
        progress.update(task, total=total, completed=i, description=target.path.name)

    return progress, update


@click.command(cls=_DoctorCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html", "sarif"]),
    default="text",
    show_default=True,
    help="Report format.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the report to this file instead of stdout.",
)
@click.option(
    "--target",
    "target",
    metavar="RUNTIME=VER,...",
    multiple=True,
    help="Deploy runtimes to check against, e.g. ort=1.20,tensorrt=10.3 (repeatable).",
)
@click.option("--dry-run", is_flag=True, help="Also push sample inputs through USG graphs (contract check).")
@click.option("--list-checks", is_flag=True, help="Document every finding code and exit.")
@click.pass_context
def doctor(
    ctx: click.Context,
    paths: tuple[Path, ...],
    fmt: str,
    output: Path | None,
    target: tuple[str, ...],
    dry_run: bool,
    list_checks: bool,
) -> None:
    """Check ONNX models, Triton repositories, USG graphs and HF model dirs before deploy.

    PATH may be an .onnx file, a config.pbtxt, a Triton model directory or
    repository, a USG graph .yaml, or a Hugging Face model directory.
    Also: `usg doctor parity ...` and `usg doctor logs FILE|-`.
    Exit code 0: no errors; 1: errors found; 2: usage or I/O problem.
    """
    if list_checks:
        click.echo(_list_checks(), nl=False)
        return
    if not paths:
        click.echo(
            "error: no PATH given; fix: usg doctor PATH... (or --list-checks, or "
            "`usg doctor logs FILE`, `usg doctor parity ...`)",
            err=True,
        )
        ctx.exit(2)
    from usg.doctor.render import render
    from usg.doctor.runner import run_doctor

    progress, update = _progress()
    try:
        report = run_doctor(paths, targets=",".join(target), dry_run=dry_run, progress=update)
    except (UsageError, MissingDependency) as exc:  # the CLI's one exit-code rule: usage 2, missing extra 1
        fail(exc, ctx)
    finally:
        if progress is not None:
            progress.stop()
    color = output is None and fmt == "text" and sys.stdout.isatty()
    checked = [f"{t.kind}:{t.path}" for t in report.targets]
    text = render(report.findings, fmt, color=color, checked=checked, elapsed_s=report.elapsed_s)
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            click.echo(
                f"error: -o {output}: cannot write the report ({exc.strerror}); "
                "fix: pass a writable file path whose folder exists",
                err=True,
            )
            ctx.exit(2)
        click.echo(f"wrote {output} ({len(report.findings)} findings, {report.errors} errors)", err=True)
    if dry_run:  # say so when the dry run passed (stderr: the report on stdout stays one format)
        from usg.cli.common import dry_run_summary

        for line in dry_run_summary(report):
            click.echo(line, err=True)
    ctx.exit(report.exit_code)
