"""ONNX checks, part 3: can the deploy runtimes run this model?

IR version and opset against the ``--target`` runtimes (ONNX Runtime's
compatibility table, TensorRT's ONNX parser), and the installed ONNX Runtime
probed for real: an unoptimised, single-threaded CPU session is built and its
failure translated into a finding naming the op and opset. Codes: ONNX003,
ONNX004, ONNX006, ONNX007, ONNX021.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from usg.doctor.findings import Finding, RootCause, Severity
from usg.doctor.onnx.checks import OnnxSubject, _custom_ops, _f, _missing_external, _short
from usg.doctor.registry import CodeInfo, check
from usg.doctor.runner import CheckContext

__all__ = ["ORT_COMPAT", "TRT_MAX_OPSET"]

E, N = Severity.ERROR, Severity.INFO

# ONNX Runtime release -> (max ai.onnx opset, max IR version), from ORT's compatibility table.
ORT_COMPAT: dict[tuple[int, int], tuple[int, int]] = {
    (1, 6): (12, 7),
    (1, 7): (13, 7),
    (1, 8): (13, 7),
    (1, 9): (14, 7),
    (1, 10): (15, 8),
    (1, 11): (16, 8),
    (1, 12): (17, 8),
    (1, 13): (17, 8),
    (1, 14): (18, 8),
    (1, 15): (19, 9),
    (1, 16): (19, 9),
    (1, 17): (20, 9),
    (1, 18): (21, 10),
    (1, 19): (21, 10),
    (1, 20): (21, 10),
    (1, 21): (22, 10),
    (1, 22): (22, 11),
    (1, 23): (23, 11),
}
# TensorRT release -> max ai.onnx opset its ONNX parser (onnx-tensorrt) imports.
TRT_MAX_OPSET: dict[tuple[int, int], int] = {
    (8, 0): 13,
    (8, 2): 13,
    (8, 4): 17,
    (8, 5): 17,
    (8, 6): 17,
    (9, 0): 17,
    (10, 0): 17,
    (10, 3): 20,
    (10, 5): 20,
    (10, 7): 21,
}

C_IR = CodeInfo(
    "ONNX003",
    E,
    RootCause.VERSION_COUPLING,
    "IR version newer than the runtime supports",
    "The model's IR version is above what the installed (or --target) ONNX Runtime loads.",
)
C_OPSET = CodeInfo(
    "ONNX004",
    E,
    RootCause.VERSION_COUPLING,
    "opset newer than the runtime supports",
    "The model imports an ai.onnx opset above what the installed or --target runtime "
    "(ONNX Runtime, TensorRT's ONNX parser) supports.",
)
C_ORT_OP = CodeInfo(
    "ONNX006",
    E,
    RootCause.UNSUPPORTED_OP,
    "op the installed ONNX Runtime cannot run",
    "Building an ONNX Runtime session fails on an op/opset pair it has no kernel for.",
)
C_SKIP = CodeInfo(
    "ONNX007",
    N,
    RootCause.CONFIG_INVALID,
    "runtime session check skipped",
    "The ONNX Runtime session was not built because the checker already rejected the model.",
)
C_ORT_FAIL = CodeInfo(
    "ONNX021",
    E,
    RootCause.UNCLASSIFIED,
    "ONNX Runtime cannot load the model",
    "Building an ONNX Runtime session fails for a reason other than a missing kernel.",
)


def _ort_version() -> tuple[int, ...]:
    import onnxruntime

    return tuple(int(x) for x in re.findall(r"\d+", onnxruntime.__version__)[:3])


def _compat_for(version: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The table row for ``version``; a release older than the table is bounded by the oldest row
    (it loads at most that: an opset or IR above it is refused for certain). Newer than the table: None."""
    key = (version[0], version[1] if len(version) > 1 else 0)
    if key in ORT_COMPAT:
        return key, ORT_COMPAT[key]
    oldest = min(ORT_COMPAT)
    if key < oldest:
        return oldest, ORT_COMPAT[oldest]
    return None


def _trt_max_opset(version: tuple[int, ...]) -> tuple[tuple[int, int], int] | None:
    """The newest table row not after ``version``; a release older than the table is bounded by the
    oldest row (its parser imports at most that opset)."""
    key = (version[0], version[1] if len(version) > 1 else 0)
    known = [k for k in TRT_MAX_OPSET if k <= key] or [min(TRT_MAX_OPSET)]
    best = max(known)
    return best, TRT_MAX_OPSET[best]


def _max_of(runtime: str, version: tuple[int, ...], row: tuple[int, int], what: str, value: int) -> str:
    """'max opset 17', or for a release older than the table 'older than 1.6, which loads at most opset 12'."""
    key = (version[0], version[1] if len(version) > 1 else 0)
    if key < row:
        return f"it predates {runtime} {_v(row)}, which supports at most {what} {value}"
    return f"max {what} {value}"


def _v(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


@check("onnx", codes=[C_IR, C_OPSET])
def check_versions(s: OnnxSubject, ctx: CheckContext) -> Iterator[Finding]:
    """IR version and opset vs the --target runtimes (the installed ORT is probed by the session check)."""
    if s.model is None:
        return
    ir = int(s.model.ir_version)
    opset = s.opset("")
    ort_target = ctx.targets.get("ort")
    if ort_target is not None:
        compat = _compat_for(ort_target)
        if compat is not None:
            row, (max_opset, max_ir) = compat
            if ir > max_ir:
                yield _f(
                    C_IR,
                    s,
                    f"IR version {ir} is newer than ONNX Runtime {_v(ort_target)} loads "
                    f"({_max_of('ONNX Runtime', ort_target, row, 'IR', max_ir)})",
                    f"re-save with model.ir_version = {max_ir} (or export with an onnx package "
                    f"matching ORT {_v(ort_target)}), or deploy a newer ONNX Runtime",
                    element="ir_version",
                    runtime="onnxruntime",
                    runtime_version=_v(ort_target),
                    model_ir_version=ir,
                    max_ir_version=max_ir,
                )
            if opset is not None and opset > max_opset:
                yield _f(
                    C_OPSET,
                    s,
                    f"opset {opset} is newer than ONNX Runtime {_v(ort_target)} supports "
                    f"({_max_of('ONNX Runtime', ort_target, row, 'opset', max_opset)})",
                    f"re-export with opset_version={max_opset} or convert with "
                    f"onnx.version_converter.convert_version(model, {max_opset})",
                    element="opset_import",
                    runtime="onnxruntime",
                    runtime_version=_v(ort_target),
                    model_opset=opset,
                    max_opset=max_opset,
                )
    trt_target = ctx.targets.get("tensorrt")
    if trt_target is not None and opset is not None:
        trt = _trt_max_opset(trt_target)
        if trt is not None and opset > trt[1]:
            yield _f(
                C_OPSET,
                s,
                f"opset {opset} is newer than TensorRT {_v(trt_target)}'s ONNX parser imports "
                f"({_max_of('TensorRT', trt_target, trt[0], 'opset', trt[1])})",
                f"re-export with opset_version={trt[1]} for TensorRT {_v(trt_target)}",
                element="opset_import",
                runtime="tensorrt",
                runtime_version=_v(trt_target),
                model_opset=opset,
                max_opset=trt[1],
            )


_NOT_IMPL_RE = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_NOT_REG_RE = re.compile(r"([\w.]*):(\w+)\((-?\d+)\) is not a registered function/op")
_IR_RE = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")
_OPSET_RE = re.compile(r"Opset (\d+) is under development")


@functools.lru_cache(maxsize=1)
def _session_options() -> Any:
    import onnxruntime as ort

    from usg.doctor.onnx.probe import silence_onnxruntime

    silence_onnxruntime()  # ONNX Runtime's C++ log lines must not reach the user's stderr
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    return so


@check("onnx", codes=[C_ORT_OP, C_SKIP, C_IR, C_OPSET, C_ORT_FAIL])
def check_ort_session(s: OnnxSubject) -> Iterator[Finding]:
    """Build an unoptimised 1-thread CPU session and translate its failure into a finding."""
    if s.model is None or _missing_external(s):
        return  # ONNX014 names the file; the session would fail to open it
    if s.checker_error is not None:
        yield _f(
            C_SKIP,
            s,
            "ONNX Runtime session not built: onnx.checker already rejected the model (see ONNX001)",
            "fix ONNX001 first, then re-run usg doctor",
        )
        return
    if _custom_ops(s):
        return  # ONNX005 already names the op; the session would fail on it first
    import onnxruntime as ort

    version = _v(_ort_version())
    try:
        ort.InferenceSession(str(s.path), _session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        yield _session_failure(s, version, str(exc))


def _session_failure(s: OnnxSubject, version: str, text: str) -> Finding:
    """Translate ONNX Runtime's session error: a missing kernel (NOT_IMPLEMENTED) or op, IR, opset, or other."""
    if m := _NOT_IMPL_RE.search(text):
        op, since, node = m.group(1), int(m.group(2)), m.group(3)
        return _f(
            C_ORT_OP,
            s,
            f"ONNX Runtime {version} has no CPU kernel for {op} (op version {since}, "
            f"model opset {s.opset('')}) at node {node!r}",
            f"re-export with an opset where {op} has a newer version (e.g. convert with "
            "onnx.version_converter.convert_version), or replace the node",
            element=node or op,
            op_type=op,
            op_since_version=since,
            model_opset=s.opset(""),
            onnxruntime=version,
            error=_short(text),
        )
    elif m := _NOT_REG_RE.search(text):
        return _f(
            C_ORT_OP,
            s,
            f"ONNX Runtime {version} does not know op {m.group(1)}:{m.group(2)}",
            "register the library implementing it, or re-export without it",
            element=m.group(2),
            domain=m.group(1),
            op_type=m.group(2),
            onnxruntime=version,
            error=_short(text),
        )
    elif m := _IR_RE.search(text):
        ir, max_ir = int(m.group(1)), int(m.group(2))
        return _f(
            C_IR,
            s,
            f"IR version {ir} is newer than the installed ONNX Runtime {version} loads (max IR {max_ir})",
            f"set model.ir_version = {max_ir} and re-save, or upgrade onnxruntime",
            element="ir_version",
            runtime="onnxruntime",
            runtime_version=version,
            model_ir_version=ir,
            max_ir_version=max_ir,
        )
    elif m := _OPSET_RE.search(text):
        return _f(
            C_OPSET,
            s,
            f"opset {m.group(1)} is newer than the installed ONNX Runtime {version} supports",
            "re-export with a released opset, or upgrade onnxruntime",
            element="opset_import",
            runtime="onnxruntime",
            runtime_version=version,
            model_opset=int(m.group(1)),
        )
    else:
        return _f(
            C_ORT_FAIL,
            s,
            f"ONNX Runtime {version} cannot build a session: {_short(text, 300)}",
            "reproduce with onnxruntime.InferenceSession(path) and fix the node it names",
            onnxruntime=version,
            error=_short(text),
        )
