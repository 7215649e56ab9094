"""Export side of ``usg doctor parity``: load the factory, name the inputs, export to ONNX.

The factory named by ``--torch`` (``package.module:func`` or ``path/to/file.py:func``) returns
``(model, example_inputs)`` where ``example_inputs`` is a tensor, a tuple of tensors or a dict
``name -> tensor``. Without ``--onnx`` the model is exported here, first with the legacy
TorchScript exporter (``torch.onnx.export(..., dynamo=False)``), then with the dynamo exporter
when the first fails. An unsupported operator whose message names the opset that added it is
retried once at that opset. Every failure becomes a finding; the exporter that produced the
file is recorded so the report can say which one was used.

torch is imported lazily: importing this module never needs it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.parity.codes import PARITY_CODES  # noqa: F401  (registers PAR003)
from usg.doctor.registry import finding
from usg.errors import MissingDependency, UsageError

__all__ = [
    "WRAPPED_SCOPE",
    "ExportResult",
    "classify_export_error",
    "export_model",
    "import_torch",
    "input_names_for",
    "load_factory",
    "parse_dynamic_axes",
]

_PURPOSE = "usg doctor parity"

# Dynamic axes: input name -> {axis index: symbolic name}
DynamicAxes = dict[str, dict[int, str]]


def import_torch() -> Any:
    """Import torch or raise :class:`MissingDependency` with the pip line."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependency("torch", "torch", _PURPOSE) from exc
    return torch


def load_factory(spec: str) -> Callable[[], Any]:
    """Resolve ``module:attr`` or ``path/to/file.py:attr`` to a callable."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UsageError(
            f"--torch {spec!r} is not of the form 'module:factory' or 'path/to/file.py:factory'; "
            "fix: name the module (or .py file) and the function that returns (model, example_inputs)"
        )
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UsageError(f"--torch {spec!r}: file {target!r} does not exist; fix: give an existing .py file")
        mod_name = f"_usg_parity_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"--torch {spec!r}: cannot import {target!r} as a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file failed while importing: not a USG error
            sys.modules.pop(mod_name, None)
            raise _import_failed(spec, target, exc) from None
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not target.startswith(exc.name):  # the module's own import failed
                raise _import_failed(spec, target, exc) from None
            raise UsageError(
                f"--torch {spec!r}: cannot import module {target!r} ({exc}); "
                "fix: make it importable (PYTHONPATH) or pass the file path 'path/to/file.py:factory'"
            ) from exc
        except Exception as exc:
            raise _import_failed(spec, target, exc) from None
    func = getattr(module, attr, None)
    if not callable(func):
        # functions defined in that module (not its imports): the factories the reader may have meant
        names = sorted(
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == module.__name__
        )
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f"did you mean {target}:{close[0]}? " if close else ""
        listed = ", ".join(names[:20]) or "(none)"
        raise UsageError(
            f"--torch {spec!r}: {target!r} has no callable {attr!r}; fix: {hint}name a function it defines "
            f"that returns (model, example_inputs): {listed}"
        )
    return func


def _import_failed(spec: str, target: str, exc: BaseException) -> UsageError:
    """The user's module raised while importing: say what, where, and what to do."""
    if isinstance(exc, SyntaxError):
        where = ""  # its message already names the file and line
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        fix = f"install the package that provides {exc.name!r} in this environment"
    else:
        fix = f"correct {target!r} at that line (its top-level code runs on import)"
    return UsageError(f"--torch {spec!r}: importing {target!r} raised {type(exc).__name__}: {exc}{where}; fix: {fix}")


def parse_dynamic_axes(text: str | None) -> DynamicAxes | None:
    """Parse ``--dynamic-axes``: ``"x:0=batch,2=h;mask:0=batch"`` or a JSON object.

    The JSON form is what ``torch.onnx.export`` takes: ``{"x": {"0": "batch"}}`` or ``{"x": [0, 2]}``.
    """
    if text is None or not text.strip():
        return None
    text = text.strip()
    out: DynamicAxes = {}
    if text.startswith("{"):
        import json

        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--dynamic-axes is not valid JSON: {exc}") from exc
        for name, spec in raw.items():
            if isinstance(spec, list):
                out[name] = {int(a): f"{name}_dim{a}" for a in spec}
            else:
                out[name] = {int(a): str(n) for a, n in spec.items()}
        return out
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, spec = part.partition(":")
        if not sep:
            raise UsageError(f"--dynamic-axes part {part!r} lacks ':'; fix: write 'input:0=batch,1=seq;other:0=batch'")
        axes: dict[int, str] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            idx, eq, sym = item.partition("=")
            try:
                axis = int(idx)
            except ValueError as exc:
                raise UsageError(f"--dynamic-axes: axis {idx!r} of {name!r} is not an integer") from exc
            axes[axis] = sym.strip() if eq else f"{name.strip()}_dim{axis}"
        out[name.strip()] = axes
    return out


def input_names_for(model: Any, inputs: Any) -> tuple[list[str], list[Any]]:
    """Names and tensors of the example inputs, in call order.

    Dict inputs keep their keys; positional tensors take the names of ``forward``'s parameters.
    """
    if isinstance(inputs, Mapping):
        return list(inputs.keys()), list(inputs.values())
    values = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
    try:
        params = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError, AttributeError):
        params = []
    names = [params[i] if i < len(params) else f"input_{i}" for i in range(len(values))]
    return names, values


@dataclass
class ExportResult:
    """What the export step produced: the file (or None), the exporter used, findings on the way."""

    path: Path | None
    exporter: str | None
    opset: int | None
    findings: list[Finding] = field(default_factory=list)


_UNSUPPORTED = re.compile(
    r"Exporting the operator '?(?P<op>[\w:.]+)'? to ONNX opset version (?P<opset>\d+) is not supported"
    r"(?:\.\s*Support for this operator was added in version (?P<added>\d+))?"
)
_DYNAMO_NO_FUNC = re.compile(r"No ONNX function found for (?:<OpOverload\(op=')?(?P<op>[\w.:]+)")


def classify_export_error(exc: BaseException, exporter: str) -> tuple[RootCause, str, dict[str, Any]]:
    """Root cause, fix and evidence for an exporter exception."""
    text = f"{type(exc).__name__}: {exc}"
    m = _UNSUPPORTED.search(text)
    if m:
        ev: dict[str, Any] = {"operator": m["op"], "opset": int(m["opset"])}
        if m["added"]:
            ev["opset_with_support"] = int(m["added"])
            fix = f"export with opset_version={m['added']} (or newer): {m['op']} exists from opset {m['added']}"
        else:
            fix = (
                f"{m['op']} has no symbolic in the legacy exporter at any opset; use the dynamo exporter "
                "(torch.onnx.export(..., dynamo=True)), register a custom symbolic, or rewrite the call"
            )
        return RootCause.UNSUPPORTED_OP, fix, ev
    m = _DYNAMO_NO_FUNC.search(text)
    if m:
        return (
            RootCause.UNSUPPORTED_OP,
            f"register an ONNX translation for {m['op']} via custom_translation_table, "
            "or export with the legacy exporter (dynamo=False)",
            {"operator": m["op"]},
        )
    low = text.lower()
    if "guard" in low or "data-dependent" in low or "constraint" in low or "specializ" in low:
        return (
            RootCause.DYNAMIC_SHAPE_FIXED,
            "the model's forward specialises a dynamic dimension (Python int() / branch on a size); "
            "keep sizes as tensors (x.shape[0] without int(), torch._check) or drop that axis from "
            "dynamic_shapes",
            {},
        )
    return (
        RootCause.UNCLASSIFIED,
        f"read the {exporter} exporter error above; try the other exporter (--exporter)",
        {},
    )


@contextlib.contextmanager
def _quiet() -> Any:
    """Silence the exporters: Python prints, warnings, and the C++ side writing to fds 1 and 2."""
    buf = io.StringIO()
    saved: list[int] = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        with tempfile.TemporaryFile() as sink:
            try:
                saved = [os.dup(1), os.dup(2)]
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
            except OSError:  # no real fds (embedded interpreter): Python-level silence only
                saved = []
            with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                warnings.simplefilter("ignore")
                yield buf
    finally:
        for fd, old in zip((1, 2), saved, strict=False):
            os.dup2(old, fd)
            os.close(old)


class _KwargsAdapter:
    """Positional -> keyword call adapter for the legacy tracer (scope prefix ``WRAPPED_SCOPE``)."""

    @staticmethod
    def make(torch: Any, model: Any, names: list[str]) -> Any:
        class Adapter(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                setattr(self, WRAPPED_SCOPE, model)

            def forward(self, *args: Any) -> Any:
                return getattr(self, WRAPPED_SCOPE)(**dict(zip(names, args, strict=True)))

        adapter = Adapter()
        adapter.train(model.training)  # a fresh Module is in training mode; the exporter restores it after
        return adapter


WRAPPED_SCOPE = "usg_wrapped"


def _export_once(
    torch: Any,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    path: Path,
    exporter: str,
    input_names: list[str],
    dynamic_axes: DynamicAxes,
    opset: int | None,
) -> None:
    with _quiet():
        if exporter == "legacy":
            if kwargs:  # the tracer takes positional inputs: adapt, keeping the keyword names
                model, args = _KwargsAdapter.make(torch, model, list(kwargs)), tuple(kwargs.values())
            torch.onnx.export(
                model,
                args,
                str(path),
                input_names=input_names,
                dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
                opset_version=opset,
                dynamo=False,
            )
            return
        dims: dict[str, Any] = {}
        sym_cache: dict[str, Any] = {}
        for name in input_names:
            axes = dynamic_axes.get(name, {})
            spec = {}
            for axis, sym in axes.items():
                if sym not in sym_cache:
                    sym_cache[sym] = torch.export.Dim(re.sub(r"\W", "_", sym))
                spec[axis] = sym_cache[sym]
            dims[name] = spec or None
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs,
            input_names=input_names,
            dynamic_shapes=dims if kwargs else tuple(dims[n] for n in input_names),
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
        program.save(str(path))


def export_model(
    model: Any,
    names: Sequence[str],
    values: Sequence[Any],
    as_kwargs: bool,
    dynamic_axes: DynamicAxes,
    workdir: Path,
    *,
    exporter: str = "auto",
    opset: int | None = None,
    source: str = "<factory>",
) -> ExportResult:
    """Export ``model`` into ``workdir``.

    ``exporter`` is ``auto`` (legacy, then dynamo if that fails), ``legacy`` or ``dynamo``.
    """
    torch = import_torch()
    order = {"auto": ["legacy", "dynamo"], "legacy": ["legacy"], "dynamo": ["dynamo"]}.get(exporter)
    if order is None:
        raise UsageError(f"--exporter {exporter!r} is not one of auto, legacy, dynamo")
    if "dynamo" in order and importlib.util.find_spec("onnxscript") is None:
        if exporter == "dynamo":
            raise MissingDependency("onnxscript", "torch", f"{_PURPOSE} --exporter dynamo")
        order = [o for o in order if o != "dynamo"]
    args: tuple[Any, ...] = () if as_kwargs else tuple(values)
    kwargs = dict(zip(names, values, strict=True)) if as_kwargs else None
    failures: list[Finding] = []
    for name in order:
        attempt_opset = opset
        for _ in range(2):  # second round: the opset the error message asked for
            path = workdir / f"model_{name}.onnx"
            try:
                _export_once(torch, model, args, kwargs, path, name, list(names), dynamic_axes, attempt_opset)
            except Exception as exc:
                cause, fix, ev = classify_export_error(exc, name)
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                failures.append(
                    finding(
                        "PAR003",
                        f"{name} exporter failed"
                        + (f" at opset {attempt_opset}" if attempt_opset else "")
                        + f": {type(exc).__name__}: {first_line[:300]}",
                        Location(source, element=f"exporter={name}"),
                        fix,
                        {"exporter": name, "opset": attempt_opset, **ev},
                        stage=Stage.PARITY,
                        root_cause=cause,
                    )
                )
                retry = ev.get("opset_with_support")
                if retry and retry != attempt_opset:
                    attempt_opset = int(retry)
                    continue
                break
            else:
                # an export that eventually succeeded turns earlier failures into warnings
                used = f" (the {name} exporter succeeded" + (f" at opset {attempt_opset}" if attempt_opset else "")
                downgraded = [
                    finding(
                        f.code,
                        f.message + used + " and was used)",
                        f.location,
                        f.fix,
                        f.evidence,
                        stage=f.stage,
                        severity=Severity.WARNING,
                        root_cause=f.root_cause,
                    )
                    for f in failures
                ]
                return ExportResult(path, name, attempt_opset, downgraded)
    return ExportResult(None, None, None, failures)
