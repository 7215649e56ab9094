"""``usg doctor logs FILE|-``: classify error lines from serving/export logs into root causes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, BinaryIO

import click

from usg.doctor.findings import Finding, Severity
from usg.doctor.logs.reader import LogReader
from usg.errors import UsageError

__all__ = ["exit_code", "logs", "render_findings"]


def render_findings(
    findings: Sequence[Finding], fmt: str, extra: dict[str, Any] | None = None, output: str | None = None
) -> None:
    """Render with the doctor's shared renderer (text/json/html/sarif, root-cause matrix included).

    ``extra`` sections (e.g. the parity shape table) are printed before a text report.
    """
    import sys as _sys

    from usg.doctor.render import render

    text = render(findings, fmt, color=output is None and fmt == "text" and _sys.stdout.isatty())
    if fmt == "text" and extra:
        sections = "\n".join(f"{title}\n{body}\n" for title, body in extra.items())
        text = f"{sections}\n{text}"
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


@contextmanager
def _byte_progress(reader: LogReader, size: int | None) -> Iterator[Callable[[int, int | None], None] | None]:
    """A progress bar on stderr for a long log, in bytes of the file read (classify_lines reports every 20 000
    lines); None off a tty."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("reading the log"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=size)

        def update(lines_read: int, _lines: int | None) -> None:
            bar.update(task, completed=reader.bytes_read)

        yield update


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


@click.command("logs")
@click.argument("source", type=str)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "html", "sarif"]), default="text", show_default=True
)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write the report to a file.")
@click.option("--no-unclassified", is_flag=True, help="Hide error lines no rule recognises (LOG000).")
def logs(source: str, fmt: str, output: str | None, no_unclassified: bool) -> None:
    """Classify the error lines of a log FILE (or - for stdin) into root causes, with a fix each.

    Knows Triton, ONNX Runtime, torch.onnx export, TensorRT, vLLM and transformers messages;
    anything else that looks like an error is reported as unclassified (LOG000).
    """
    from usg.doctor.logs.classify import classify_lines

    with ExitStack() as stack:
        if source == "-":
            fh: BinaryIO = sys.stdin.buffer
            name, size = "<stdin>", None
        else:
            try:
                fh = stack.enter_context(open(source, "rb"))
                size = os.fstat(fh.fileno()).st_size if os.path.isfile(source) else None
            except OSError as exc:
                raise UsageError(
                    f"cannot read log file {source!r}: {exc.strerror}; fix: give a readable file or -"
                ) from exc
            name = source
        reader = LogReader(fh, name)  # read a chunk at a time: memory stays bounded for a log of any size
        progress = stack.enter_context(_byte_progress(reader, size))
        try:
            findings = classify_lines(reader, name, progress=progress)
        except OSError as exc:
            raise UsageError(f"cannot read log file {name!r}: {exc.strerror}; fix: give a readable file or -") from exc
    if no_unclassified:
        findings = [f for f in findings if f.code != "LOG000"]
    render_findings(findings, fmt, output=output)
    sys.exit(exit_code(findings))
