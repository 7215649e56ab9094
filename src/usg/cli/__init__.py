"""The ``usg`` command line: a thin layer that parses, calls a function, renders.

Subcommands live one per module in this package and are imported only when
invoked, so ``usg plan`` does not pay for importing onnxruntime or starlette.
Every :class:`usg.errors.USGError` becomes a one-paragraph message and a
non-zero exit code — never a traceback. The exit-code rule, for every command
(:func:`exit_code_for` is its one implementation):

- 0 (:data:`EXIT_OK`): the work was done and nothing failed;
- 1 (:data:`EXIT_FAILED`): the work itself failed — a bad model or graph, a corrupt
  image, a check that found errors, a missing optional package (with its pip line);
- 2 (:data:`EXIT_USAGE`): the command line is wrong — an unknown flag or value, a path
  that does not exist, an unknown input name, no inputs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, NoReturn

import click

from usg.errors import UsageError, USGError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "cli", "exit_code_for", "fail", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# command name -> "module:attribute" (a click.Command)
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("usg.cli.run_cmd:run", "Push inputs through a graph and print its outputs."),
    "init": ("usg.cli.init_cmd:init", "Write a runnable graph for an ONNX model, with sample inputs."),
    "graph": ("usg.cli.graph_cmd:graph", "Inspect a graph: nodes, edges, specs, pruning."),
    "export": ("usg.cli.export_cmd:export", "Export models to ONNX, or a graph to a Triton model repository."),
    "serve": ("usg.cli.serve_cmd:serve", "Serve a graph over HTTP (JSON/multipart and Open Inference v2)."),
    "doctor": ("usg.cli.doctor_cmd:doctor", "Check ONNX models, Triton repositories, graphs, logs."),
    "plan": ("usg.cli.plan_cmd:plan", "Size weights, KV cache and engine limits for LLM/VLM serving."),
    "bench": ("usg.cli.bench_cmd:bench", "Benchmark a graph or server against the alternatives."),
    "tune": ("usg.cli.bench_cmd:tune", "Profile models and choose batch sizes and threads."),
    "index": ("usg.cli.index_cmd:index", "Index scanned documents and text files for search."),
    "search": ("usg.cli.search_cmd:search", "Search an index of documents with a text or an image."),
    "profile": ("usg.cli.profile_cmd:profile", "Record a reference profile of a graph's inputs and outputs."),
    "drift": ("usg.cli.drift_cmd:drift", "Compare a window profile with a reference profile (drift tests)."),
    "report": ("usg.cli.report_cmd:report", "Reports from traces: SLO-violation attribution per node and cause."),
    "quantize": ("usg.cli.quantize_cmd:quantize", "Quantize models to INT8/INT4, guarded on the graph's outputs."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in _COMMANDS if self._available(name))

    @staticmethod
    def _available(name: str) -> bool:
        module = _COMMANDS[name][0].split(":")[0]
        return importlib.util.find_spec(module) is not None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None or not self._available(cmd_name):
            return None
        module_name, attr = entry[0].split(":")
        module = importlib.import_module(module_name)
        cmd = getattr(module, attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="usg")
def cli() -> None:
    """USG — Unified Serving Graph: serve multimodal pipelines, check their contracts."""


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an error, by the rule in this module's docstring."""
    if isinstance(exc, click.UsageError | UsageError):  # click: unknown flag, bad value, missing path
        return EXIT_USAGE
    if isinstance(exc, click.ClickException):
        return exc.exit_code
    return EXIT_FAILED  # USGError (MissingDependency included: the pip line is in its message), anything else


def fail(exc: USGError, ctx: click.Context | None = None) -> NoReturn:
    """Print ``error: ...`` for ``exc`` on stderr and exit with its code (for commands that catch errors)."""
    click.echo(f"error: {exc}", err=True)
    code = exit_code_for(exc)
    if ctx is not None:
        ctx.exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point: maps errors to a message and an exit code (see :func:`exit_code_for`)."""
    try:
        result = cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exit_code_for(exc))
    except USGError as exc:
        fail(exc)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug of ours: say so in one paragraph; USG_DEBUG=1 shows the traceback
        if os.environ.get("USG_DEBUG"):
            raise
        click.echo(
            f"internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in usg; rerun with USG_DEBUG=1 for the traceback and report it.",
            err=True,
        )
        sys.exit(1)
    if isinstance(result, int):  # ctx.exit(code) under standalone_mode=False returns the code
        sys.exit(result)
    return result
