"""``usg doctor parity``: does the ONNX model compute what the PyTorch model computes, at every shape?

The factory returns ``(model, example_inputs)``. The ONNX file is either given or exported here
(:mod:`usg.doctor.parity.export`). Both runtimes then run on a *shape plan*, not only on the
export's dummy inputs (Optimum's validator checks only those, which is how frozen shapes slip
through):

* the export shape, with the example inputs themselves;
* batch 1, 2 and 7 on every symbol that names axis 0 of some input;
* three sizes (half, same, double the export size) along every other dynamic axis, one axis
  varied at a time, plus one case with every axis away from its export size.

New inputs keep the example's dtype and value range (integer inputs — token ids, masks — are
drawn from the example's own value range; a constant input stays constant).

Per case and output we report the max absolute error and the max relative error, the latter
as ``max|onnx - torch| / max|torch|`` (relative to the output's scale, so near-zero elements do
not blow it up). A case passes when ``|onnx - torch| <= atol + rtol * |torch|`` everywhere.

Findings (stage ``parity``):

========  =====================  ==========================================================
PAR000    info                   summary: exporter used, cases run, max errors
PAR001    dynamic_shape_fixed    passes at the export shape, fails/differs at another shape;
                                 names the Reshape/Expand/Constant holding the frozen value
PAR002    op_semantic_drift      differs beyond tolerance at the export shape; names the
                                 first diverging module / node (:mod:`parity_bisect`)
PAR003    (classified)           an exporter failed (unsupported op → the opset that has it)
PAR004    shape_or_rank          torch itself fails at a planned shape (model not dynamic)
PAR005    dynamic_shape_fixed    an axis requested dynamic is a fixed size in the ONNX inputs
PAR006    shape_or_rank          ONNX Runtime fails at the export shape itself, or the
                                 output count differs
========  =====================  ==========================================================
"""

from __future__ import annotations

import difflib
import math
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from usg.doctor.findings import Finding, Location, Stage
from usg.doctor.parity.bisection import first_divergence_fp64, first_divergent_module, frozen_nodes
from usg.doctor.parity.codes import PARITY_CODES
from usg.doctor.parity.export import (
    DynamicAxes,
    export_model,
    import_torch,
    input_names_for,
    load_factory,
)
from usg.doctor.registry import finding
from usg.errors import UsageError

__all__ = ["PARITY_CODES", "CaseResult", "ParityReport", "plan_shapes", "run_parity"]


BATCH_SIZES = (1, 2, 7)


@dataclass
class CaseResult:
    """One planned shape: sizes per symbol, per-output errors, and what went wrong if anything."""

    label: str
    sizes: dict[str, int]
    shapes: dict[str, list[int]]
    max_abs_err: list[float] = field(default_factory=list)
    max_rel_err: list[float] = field(default_factory=list)
    passed: bool = False
    torch_error: str | None = None
    onnx_error: str | None = None
    mismatch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ParityReport:
    onnx_path: Path | None
    exporter: str | None
    cases: list[CaseResult]
    findings: list[Finding]


def plan_shapes(
    export_sizes: Mapping[str, int],
    batch_symbols: set[str],
    overrides: Mapping[str, Sequence[int]] | None = None,
) -> list[tuple[str, dict[str, int]]]:
    """The shape plan (see module docstring): ``[(label, {symbol: size})]``, export shape first."""
    base = dict(export_sizes)
    options: dict[str, list[int]] = {}
    for sym, n in export_sizes.items():
        if overrides and sym in overrides:
            sizes = list(overrides[sym])
        elif sym in batch_symbols:
            sizes = list(BATCH_SIZES)
        else:
            sizes = [max(1, n // 2), n, 2 * n] if n > 1 else [1, 2, 4]
        options[sym] = sorted(set(sizes))
    plan: list[tuple[str, dict[str, int]]] = [("export", base)]
    seen = {tuple(sorted(base.items()))}
    for sym, sizes in options.items():
        for s in sizes:
            case = {**base, sym: s}
            key = tuple(sorted(case.items()))
            if key not in seen:
                seen.add(key)
                plan.append((f"{sym}={s}", case))
    if len(options) > 1:
        mixed = {sym: max(sizes, key=lambda s: (s != base[sym], s)) for sym, sizes in options.items()}
        if tuple(sorted(mixed.items())) not in seen:
            plan.append(("all=" + ",".join(f"{k}{v}" for k, v in mixed.items()), mixed))
    return plan


#: a case whose input tensor would take more than this is refused before it is made (PyTorch, ONNX Runtime and
#: the outputs each hold at least as much again)
MAX_CASE_BYTES = 1 << 30


def _make_input(torch: Any, example: Any, shape: list[int], gen: Any) -> Any:
    if list(example.shape) == shape:
        return example
    nbytes = math.prod(shape) * example.element_size()
    if nbytes > MAX_CASE_BYTES:
        raise UsageError(
            f"an input of shape {shape} ({example.dtype}) would take {nbytes / 2**30:.1f} GiB, past the "
            f"{MAX_CASE_BYTES // 2**30} GiB a parity case may allocate; fix: pass smaller --sizes"
        )
    if example.dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not example.is_floating_point():
        ilo, ihi = int(example.min()), int(example.max())
        if ilo == ihi:
            return torch.full(shape, ilo, dtype=example.dtype)
        return torch.randint(ilo, ihi + 1, shape, generator=gen, dtype=example.dtype)
    lo, hi = float(example.min()), float(example.max())
    if lo == hi:
        return torch.full(shape, lo, dtype=example.dtype)
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(example.dtype)


def _flatten(obj: Any, torch: Any) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if hasattr(obj, "to_tuple"):
        obj = obj.to_tuple()
    if isinstance(obj, Mapping):
        return [x for v in obj.values() for x in _flatten(v, torch)]
    if isinstance(obj, list | tuple):
        return [x for v in obj for x in _flatten(v, torch)]
    return []


def _first_line(exc: BaseException) -> str:
    """The error's head; ORT puts the values on the next lines ("index: 0 Got: 1 Expected: 2")."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' '.join(lines[:3])}"[:500]


def _dims(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    init = {i.name for i in model.graph.initializer}
    out: dict[str, list[int | str | None]] = {}
    for inp in model.graph.input:
        if inp.name in init:
            continue
        out[inp.name] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in inp.type.tensor_type.shape.dim
        ]
    return out


def run_parity(
    torch_spec: str | Any,
    onnx_path: Path | None = None,
    dynamic_axes: DynamicAxes | None = None,
    *,
    exporter: str = "auto",
    opset: int | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    sizes: Mapping[str, Sequence[int]] | None = None,
    workdir: Path | None = None,
) -> ParityReport:
    """Run the parity check. ``torch_spec`` is a ``module:factory`` string or the factory itself.

    Without ``onnx_path`` the model is exported into ``workdir`` (kept) or a temporary directory
    (removed; the report's ``onnx_path`` is then None).
    """

    def go(workdir: Path | None, temporary: bool) -> ParityReport:
        return _run(
            torch_spec,
            onnx_path,
            dynamic_axes,
            exporter=exporter,
            opset=opset,
            atol=atol,
            rtol=rtol,
            sizes=sizes,
            workdir=workdir,
            temporary=temporary,
        )

    if onnx_path is not None or workdir is not None:
        return go(workdir, False)
    with tempfile.TemporaryDirectory(prefix="usg-parity-") as tmp:
        report = go(Path(tmp), True)
    report.onnx_path = None
    return report


GIVEN = "given (--onnx)"  # what the report shows as the exporter when the ONNX file was given


@dataclass
class _Subject:
    """The eager model and its example inputs, by input name."""

    source: str
    model: Any
    names: list[str]
    values: list[Any]
    as_kwargs: bool

    @property
    def example(self) -> dict[str, Any]:
        return dict(zip(self.names, self.values, strict=True))

    def default_axes(self) -> DynamicAxes:
        return {n: {0: "batch"} for n, v in zip(self.names, self.values, strict=True) if v.dim() >= 1}


def _run(
    torch_spec: str | Any,
    onnx_path: Path | None,
    dynamic_axes: DynamicAxes | None,
    *,
    exporter: str,
    opset: int | None,
    atol: float,
    rtol: float,
    sizes: Mapping[str, Sequence[int]] | None,
    workdir: Path | None,
    temporary: bool,
) -> ParityReport:
    """Load the factory, export (unless given), plan the shapes, run each case on both, then judge."""
    torch = import_torch()
    subj = _load_subject(torch, torch_spec)
    if dynamic_axes is not None:
        _check_axes_names(dynamic_axes, subj.names, subj.example)
    findings: list[Finding] = []
    given = onnx_path is not None
    exporter_used: str | None = GIVEN
    if onnx_path is None:
        assert workdir is not None
        exported = export_model(
            subj.model,
            subj.names,
            subj.values,
            subj.as_kwargs,
            dynamic_axes or subj.default_axes(),
            workdir,
            exporter=exporter,
            opset=opset,
            source=subj.source,
        )
        findings.extend(exported.findings)
        subj.model.eval()  # exporters toggle training mode; make sure dropout stays off
        if exported.path is None:
            return ParityReport(None, None, [], findings)
        onnx_path, exporter_used = exported.path, exported.exporter
    proto = onnx.load(str(onnx_path))
    onnx_dims = _dims(proto)
    rename = _match_input_names(subj.names, list(onnx_dims))
    if dynamic_axes is None and given:  # the given file's symbolic dims say which axes are dynamic
        dynamic_axes = {
            n: {i: str(d) for i, d in enumerate(onnx_dims[rename[n]]) if isinstance(d, str)} for n in subj.names
        }
    axes = dynamic_axes or subj.default_axes()
    loc_file = str(onnx_path) if not temporary else f"{subj.source} (exported, {exporter_used} exporter)"
    findings.extend(_fixed_axis_findings(axes, onnx_dims, rename, loc_file))
    export_sizes, batch_syms = _export_sizes(axes, subj.example)
    unknown = sorted(set(sizes or {}) - set(export_sizes))
    if unknown:
        raise UsageError(
            f"--sizes names symbol(s) {unknown} that no dynamic axis has (symbols: {sorted(export_sizes)}); "
            f"fix: use one of {sorted(export_sizes)}, or declare the axis with --dynamic-axes"
        )
    plan = plan_shapes(export_sizes, batch_syms, sizes)
    cases, feeds_by_label = _run_cases(torch, subj, onnx_path, plan, axes, rename, atol, rtol)
    findings.extend(_case_findings(cases, proto, loc_file, axes, export_sizes, atol, rtol))
    base = cases[0]
    if base.onnx_error is None and base.torch_error is None and not base.passed and not base.mismatch:
        findings.append(
            _drift_finding(
                proto, subj.model, subj.as_kwargs, subj.names, feeds_by_label["export"], base, loc_file, atol, rtol
            )
        )
    findings.append(_summary(cases, exporter_used, loc_file))
    return ParityReport(onnx_path, exporter_used, cases, findings)


def _load_subject(torch: Any, torch_spec: str | Any) -> _Subject:
    factory = load_factory(torch_spec) if isinstance(torch_spec, str) else torch_spec
    source = torch_spec if isinstance(torch_spec, str) else getattr(factory, "__name__", "<factory>")
    try:
        made = factory()
    except Exception as exc:  # the user's code failed: say where, not "a bug in usg"
        frames = traceback.extract_tb(exc.__traceback__)  # [0]: the call above
        code = getattr(factory, "__code__", None)
        own = [f for f in frames[1:] if code is not None and f.filename == code.co_filename]
        frame = (own or frames)[-1]  # the factory's own line, not torch's where the error surfaced
        raise UsageError(
            f"factory {source!r} raised {type(exc).__name__}: {exc} (at {frame.filename}:{frame.lineno}); "
            "fix: make the factory return (model, example_inputs) when called with no arguments"
        ) from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise UsageError(f"factory {source!r} must return (model, example_inputs), got {type(made).__name__}")
    model, example = made
    model.eval()
    names, values = input_names_for(model, example)
    return _Subject(source, model, list(names), list(values), isinstance(example, Mapping))


def _match_input_names(names: list[str], onnx_names: list[str]) -> dict[str, str]:
    """Factory input name -> ONNX input name (positional when the names differ but the counts agree)."""
    if set(names) == set(onnx_names):
        return {n: n for n in names}
    if len(onnx_names) != len(names):
        raise UsageError(
            f"the ONNX model has inputs {onnx_names} but the factory gives {len(names)} ({names}); "
            "fix: return example inputs as a dict keyed by the ONNX input names"
        )
    return dict(zip(names, onnx_names, strict=True))


def _fixed_axis_findings(
    axes: DynamicAxes, onnx_dims: Mapping[str, list[int | str | None]], rename: Mapping[str, str], loc_file: str
) -> list[Finding]:
    """PAR005: axes requested dynamic but fixed in the graph's inputs."""
    out = []
    for n, ax in axes.items():
        dims = onnx_dims.get(rename.get(n, n), [])
        for a, sym in ax.items():
            if a < len(dims) and isinstance(dims[a], int) and dims[a]:
                out.append(
                    finding(
                        "PAR005",
                        f"input {n!r} axis {a} ({sym}) should be dynamic but the ONNX graph fixes it to {dims[a]}",
                        Location(loc_file, element=f"input {rename.get(n, n)}"),
                        "the exporter specialised this axis (a Python int() or a branch on the size in "
                        "forward); "
                        "keep sizes symbolic, or with the dynamo exporter check the export log for the guard",
                        {"input": n, "axis": a, "symbol": sym, "onnx_dim": dims[a]},
                        stage=Stage.PARITY,
                    )
                )
    return out


def _check_axes_names(axes: DynamicAxes, names: Sequence[str], example: Mapping[str, Any]) -> None:
    """--dynamic-axes must name the factory's inputs and axes they have (a typo would leave the axis fixed)."""
    for n, ax in axes.items():
        if n not in names:
            close = difflib.get_close_matches(n, list(names), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"--dynamic-axes names input {n!r}, which the model does not take (inputs: {list(names)}); "
                f"fix: {hint}name one of the model's inputs"
            )
        if n not in example or not hasattr(example[n], "dim"):
            continue
        rank = int(example[n].dim())
        bad = sorted(a for a in ax if not 0 <= a < rank)
        if bad:
            raise UsageError(
                f"--dynamic-axes gives input {n!r} axis {bad[0]}, but its example is rank {rank} "
                f"(shape {list(example[n].shape)}); fix: use an axis from 0 to {rank - 1}"
            )


def _export_sizes(axes: DynamicAxes, example: Mapping[str, Any]) -> tuple[dict[str, int], set[str]]:
    """Each dynamic symbol's size in the example inputs, and the symbols that sit on axis 0."""
    export_sizes: dict[str, int] = {}
    batch_syms: set[str] = set()
    for n, ax in axes.items():
        for a, sym in ax.items():
            if n in example and a < example[n].dim():
                export_sizes.setdefault(sym, int(example[n].shape[a]))
                if a == 0:
                    batch_syms.add(sym)
    return export_sizes, batch_syms


_Feeds = tuple[dict[str, np.ndarray], dict[str, Any]]


def _run_cases(
    torch: Any,
    subj: _Subject,
    onnx_path: Path,
    plan: list[tuple[str, dict[str, int]]],
    axes: DynamicAxes,
    rename: Mapping[str, str],
    atol: float,
    rtol: float,
) -> tuple[list[CaseResult], dict[str, _Feeds]]:
    """Run every planned shape through PyTorch and ONNX Runtime and compare the outputs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures are reported as findings, not log lines
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(0)
    example = subj.example
    cases: list[CaseResult] = []
    feeds_by_label: dict[str, _Feeds] = {}
    for label, case_sizes in plan:
        inputs: dict[str, Any] = {}
        for n in subj.names:
            shape = list(example[n].shape)
            for a, sym in axes.get(n, {}).items():
                if a < len(shape):
                    shape[a] = case_sizes[sym]
            inputs[n] = _make_input(torch, example[n], shape, gen)
        result = CaseResult(label, dict(case_sizes), {n: list(t.shape) for n, t in inputs.items()})
        cases.append(result)
        try:
            with torch.no_grad():
                out = subj.model(**inputs) if subj.as_kwargs else subj.model(*[inputs[n] for n in subj.names])
            ref = [t.detach().cpu().numpy() for t in _flatten(out, torch)]
        except Exception as exc:
            result.torch_error = _first_line(exc)
            continue
        feeds = {rename[n]: t.detach().cpu().numpy() for n, t in inputs.items()}
        feeds_by_label[label] = (feeds, inputs)
        try:
            got = sess.run(None, feeds)
        except Exception as exc:
            result.onnx_error = _first_line(exc)
            continue
        _compare(result, [np.asarray(g) for g in got], ref, atol, rtol)
    return cases, feeds_by_label


def _compare(result: CaseResult, got: list[np.ndarray], ref: list[np.ndarray], atol: float, rtol: float) -> None:
    """Fill ``result`` with per-output errors; it passes when every output is close and the counts agree."""
    if len(got) != len(ref):
        result.mismatch = f"ONNX returns {len(got)} outputs, torch {len(ref)}"
    ok = True
    for g, r in zip(got, ref, strict=False):
        if g.shape != r.shape:
            result.mismatch = f"output shape {list(g.shape)} vs torch {list(r.shape)}"
            result.max_abs_err.append(float("inf"))
            result.max_rel_err.append(float("inf"))
            ok = False
            continue
        diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        mabs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(r).max()) if r.size else 0.0
        result.max_abs_err.append(mabs)
        result.max_rel_err.append(mabs / scale if scale > 0 else mabs)
        ok = ok and bool(np.allclose(g, r, atol=atol, rtol=rtol, equal_nan=True))
    result.passed = ok and len(got) == len(ref)


def _case_findings(
    cases: list[CaseResult],
    proto: onnx.ModelProto,
    loc_file: str,
    axes: DynamicAxes,
    export_sizes: Mapping[str, int],
    atol: float,
    rtol: float,
) -> list[Finding]:
    out: list[Finding] = []
    base = cases[0]
    for c in cases:
        if c.torch_error:
            out.append(
                finding(
                    "PAR004",
                    f"PyTorch itself fails at {c.label} ({c.shapes}): {c.torch_error}; shape skipped",
                    Location(loc_file),
                    "the eager model does not accept this size; if it should, fix forward, "
                    "otherwise drop the axis from --dynamic-axes or pass --sizes",
                    {"case": c.label, "shapes": c.shapes},
                    stage=Stage.PARITY,
                )
            )
    if base.onnx_error or (base.mismatch and base.torch_error is None):
        out.append(
            finding(
                "PAR006",
                f"ONNX Runtime fails on the export inputs themselves: {base.onnx_error or base.mismatch}",
                Location(loc_file),
                "the ONNX file does not match this factory's inputs; re-export, or give matching example inputs",
                {"shapes": base.shapes},
                stage=Stage.PARITY,
            )
        )
        return out
    if not base.passed:
        return out
    bad = [c for c in cases[1:] if c.torch_error is None and not c.passed]
    if not bad:
        return out
    syms = sorted({s for c in bad for s, v in c.sizes.items() if v != export_sizes.get(s)})
    sym_axis = {sym: a for ax in axes.values() for a, sym in ax.items()}
    nodes = []
    for sym in syms:
        nodes += frozen_nodes(proto, export_sizes[sym], None, next((c.onnx_error for c in bad if c.onnx_error), None))
    nodes = list({f.node: f for f in nodes}.values())
    nodes.sort(key=lambda f: not f.why.startswith("constant"))
    where = ", ".join(
        f"{f.op_type} {f.node!r}" + (f" (constant {f.constant} = {list(f.values)})" if f.constant else "")
        for f in nodes
        if f.why.startswith("constant")
    )
    failed_at = [f"{f.op_type} {f.node!r}" for f in nodes if not f.why.startswith("constant")]
    first = bad[0]
    what = (
        first.onnx_error
        or first.mismatch
        or (f"max abs err {max(first.max_abs_err):.3g} > atol {atol} + rtol {rtol}·|ref|")
    )
    out.append(
        finding(
            "PAR001",
            f"ONNX matches PyTorch at the export shape but not at {', '.join(c.label for c in bad)}: {what}"
            + (f"; frozen value held by {where}" if where else "")
            + (f"; ONNX Runtime failed at {failed_at[0]}" if failed_at else ""),
            Location(loc_file, element=nodes[0].node if nodes else None),
            "the trace recorded a size as a constant: replace int(x.shape[i]) / x.view(<literal>, -1) with "
            "x.reshape(x.shape[0], -1) or x.flatten(1) (sizes stay symbolic), then re-export",
            {
                "export_sizes": dict(export_sizes),
                "failing_cases": [c.to_dict() for c in bad],
                "symbols": {s: sym_axis.get(s) for s in syms},
                "frozen_nodes": [f.__dict__ for f in nodes],
            },
            stage=Stage.PARITY,
        )
    )
    return out


def _drift_finding(
    proto: onnx.ModelProto,
    model: Any,
    as_kwargs: bool,
    names: list[str],
    feeds_inputs: tuple[dict[str, np.ndarray], dict[str, Any]],
    base: CaseResult,
    loc_file: str,
    atol: float,
    rtol: float,
) -> Finding:
    torch = import_torch()
    feeds, inputs = feeds_inputs

    def run() -> Any:
        with torch.no_grad():
            return model(**inputs) if as_kwargs else model(*[inputs[n] for n in names])

    div = first_divergent_module(proto, model, run, feeds, atol, rtol)
    if div is None:
        div = first_divergence_fp64(proto, feeds, atol, rtol)
    evidence: dict[str, Any] = {
        "max_abs_err": base.max_abs_err,
        "max_rel_err": base.max_rel_err,
        "atol": atol,
    }
    where = ""
    if div is not None:
        evidence["first_divergence"] = {
            "method": div.method,
            "where": div.where,
            "onnx_nodes": div.onnx_nodes[:20],
            "max_abs_err": div.max_abs_err,
            **div.detail,
        }
        kind = "module" if div.method == "torch_modules" else "ONNX node (vs float64 run of the graph)"
        where = f"; first diverging {kind}: {div.where!r} ({', '.join(div.onnx_nodes[:4])})"
    return finding(
        "PAR002",
        f"ONNX Runtime differs from PyTorch at the export shape: max abs err {max(base.max_abs_err):.3g} "
        f"(atol {atol}, rtol {rtol}){where}",
        Location(loc_file, element=div.where if div else None),
        "compare the op's attributes with the torch call (e.g. Resize coordinate_transformation_mode vs "
        "align_corners, nearest_mode, cubic_coeff_a); re-export with the matching setting or a newer opset",
        evidence,
        stage=Stage.PARITY,
    )


def _summary(cases: list[CaseResult], exporter: str | None, loc_file: str) -> Finding:
    rows = {c.label: [round(e, 9) for e in c.max_abs_err] for c in cases if c.max_abs_err}
    worst = max((e for c in cases for e in c.max_abs_err if e != float("inf")), default=0.0)
    return finding(
        "PAR000",
        f"parity: exporter {exporter}; {sum(c.passed for c in cases)}/{len(cases)} shapes pass; "
        f"worst max abs err {worst:.3g}",
        Location(loc_file),
        "none needed" if all(c.passed for c in cases) else "see the other findings",
        {"exporter": exporter, "cases": [c.to_dict() for c in cases], "max_abs_err_per_case": rows},
        stage=Stage.PARITY,
    )
