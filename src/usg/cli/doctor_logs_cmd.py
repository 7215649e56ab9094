"""``usg doctor logs FILE|-``: classify error lines from serving/export logs into root causes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from usg.doctor.findings import Finding, Severity
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


def _decode(data: bytes, name: str) -> str:
    """The log as text; a binary file (NUL bytes, or mostly undecodable) is a usage error, not "no findings"."""
    head = data[:65536]
    if b"\x00" in head:
        raise UsageError(
            f"{name} is not a text log: it contains NUL bytes (binary data, e.g. a model or an archive); "
            "fix: give the server's or the exporter's text log (e.g. docker logs <container> > server.log)"
        )
    text = data.decode("utf-8", errors="replace")
    sample = text[:65536]
    if sample and sample.count("\ufffd") > 0.1 * len(sample):
        raise UsageError(
            f"{name} is not a UTF-8 text log ({sample.count(chr(0xFFFD))} undecodable characters in the first "
            f"{len(sample)}); fix: give the text log, or convert it first (iconv -f <encoding> -t utf-8)"
        )
    return text


@contextmanager
def _line_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for a long log (classify_text reports every 20 000 lines); None off a tty."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("reading the log"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("lines"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, total=total, completed=done)

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
    from usg.doctor.logs.classify import classify_text

    data_holder: list[bytes] = []
    if source == "-":
        data_holder.append(sys.stdin.buffer.read())
        name = "<stdin>"
    else:
        try:
            with open(source, "rb") as fh:
                data_holder.append(fh.read())
        except OSError as exc:
            raise UsageError(
                f"cannot read log file {source!r}: {exc.strerror}; fix: give a readable file or -"
            ) from exc
        name = source
    text = _decode(data_holder[0], name)
    del data_holder[:]  # the bytes are not needed once decoded (a large log is held once, not twice)
    with _line_progress() as progress:
        findings = classify_text(text, name, progress=progress)
    if no_unclassified:
        findings = [f for f in findings if f.code != "LOG000"]
    render_findings(findings, fmt, output=output)
    sys.exit(exit_code(findings))
