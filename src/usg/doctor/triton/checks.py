"""Triton checks on one model directory, as Triton validates it at load time.

Parse errors (with line/column), name vs directory, dims, reshape, batching,
instance groups, version policy vs version folders, platform/backend names and
default model files. The cross-check against the ONNX file is in
:mod:`usg.doctor.triton.crosscheck`, ensembles in :mod:`usg.doctor.triton.ensemble`.

Codes: TRITON001-TRITON015.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from usg.doctor.findings import Finding, Location, RootCause, Severity
from usg.doctor.registry import CodeInfo, check, finding
from usg.doctor.triton.config import TritonModel, model_config_pb2

__all__ = ["BACKEND_FILES", "PLATFORMS", "tf"]

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO

# platform -> (backend it runs on, default model file name)
PLATFORMS: dict[str, tuple[str, str | None]] = {
    "onnxruntime_onnx": ("onnxruntime", "model.onnx"),
    "tensorrt_plan": ("tensorrt", "model.plan"),
    "pytorch_libtorch": ("pytorch", "model.pt"),
    "tensorflow_savedmodel": ("tensorflow", "model.savedmodel"),
    "tensorflow_graphdef": ("tensorflow", "model.graphdef"),
    "ensemble": ("", None),
}
# stock backend -> default model file name (None: no single file to look for)
BACKEND_FILES: dict[str, str | None] = {
    "onnxruntime": "model.onnx",
    "tensorrt": "model.plan",
    "pytorch": "model.pt",
    "tensorflow": "model.savedmodel",
    "openvino": "model.xml",
    "python": "model.py",
    "dali": "model.dali",
    "fil": None,
    "vllm": "model.json",
    "tensorrtllm": None,
    "identity": None,
}
_SUFFIX_BACKEND = {
    ".onnx": "onnxruntime",
    ".plan": "tensorrt",
    ".pt": "pytorch",
    ".py": "python",
    ".savedmodel": "tensorflow",
    ".xml": "openvino",
}

C_PARSE = CodeInfo(
    "TRITON001",
    E,
    RootCause.CONFIG_INVALID,
    "config.pbtxt does not parse",
    "The file is not valid protobuf text for Triton's ModelConfig (unknown field, wrong "
    "value type, bad enum); Triton refuses to load the model.",
)
C_NAME = CodeInfo(
    "TRITON002",
    E,
    RootCause.CONFIG_INVALID,
    "model name differs from its directory",
    "Triton requires the name field to equal the model directory's name.",
)
C_DIMS = CodeInfo(
    "TRITON003",
    E,
    RootCause.SHAPE_OR_RANK,
    "invalid dims",
    "Every dim must be >= 1 or -1 (variable), and dims may not be empty without reshape.",
)
C_RESHAPE = CodeInfo(
    "TRITON004",
    E,
    RootCause.SHAPE_OR_RANK,
    "reshape element count differs from dims",
    "reshape.shape must hold as many elements as dims (and the same variable dims).",
)
C_MBS = CodeInfo("TRITON005", E, RootCause.BATCH_DIM_CONFIG, "invalid max_batch_size", "max_batch_size must be >= 0.")
C_DYN = CodeInfo(
    "TRITON006",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "dynamic_batching without batching",
    "dynamic_batching needs max_batch_size > 0; with 0 the model does not batch.",
)
C_PREF = CodeInfo(
    "TRITON007",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "preferred_batch_size above max_batch_size",
    "Every preferred_batch_size must be between 1 and max_batch_size.",
)
C_INSTANCE = CodeInfo(
    "TRITON008",
    E,
    RootCause.CONFIG_INVALID,
    "invalid instance_group",
    "A KIND_CPU/KIND_MODEL group lists GPUs, a GPU id is negative, or an ensemble declares instance groups.",
)
C_VERSION = CodeInfo(
    "TRITON009",
    E,
    RootCause.CONFIG_INVALID,
    "version policy vs version folders",
    "The version_policy names versions with no folder, or there is no numeric version "
    "folder at all; Triton loads nothing (a warning when version_policy.latest asks for "
    "more versions than exist: Triton loads those there are).",
    also_severities=(W,),
)
C_PLATFORM = CodeInfo(
    "TRITON010",
    E,
    RootCause.CONFIG_INVALID,
    "unknown or inconsistent platform/backend",
    "platform is not one Triton knows, backend contradicts platform, or neither is set "
    "and no model file lets Triton guess.",
)
C_FILE = CodeInfo(
    "TRITON011",
    E,
    RootCause.ENVIRONMENT,
    "model file missing in a version folder",
    "A version folder lacks the file Triton opens (default_model_filename or the "
    "backend's default, e.g. model.onnx / model.plan / model.pt / model.savedmodel).",
)
C_DTYPE = CodeInfo(
    "TRITON012",
    E,
    RootCause.DTYPE_OR_RANGE,
    "tensor without data_type",
    "An input/output has no data_type (TYPE_INVALID).",
)
C_DUP = CodeInfo(
    "TRITON013",
    E,
    RootCause.CONFIG_INVALID,
    "duplicate tensor name",
    "Two inputs (or two outputs) share a name.",
)
C_BACKEND = CodeInfo(
    "TRITON014",
    W,
    RootCause.ENVIRONMENT,
    "backend is not a stock Triton backend",
    "A custom backend must be installed under the server's backend directory.",
)
C_NO_IO = CodeInfo(
    "TRITON015",
    W,
    RootCause.CONFIG_INVALID,
    "no inputs or outputs declared",
    "Without auto-complete (--disable-auto-complete-config, or TensorRT/ensemble) Triton "
    "needs every input and output declared.",
)


def tf(
    info: CodeInfo,
    m: TritonModel,
    message: str,
    fix: str,
    element: str | None = None,
    line: int | None = None,
    severity: Severity | None = None,
    column: int | None = None,
    **evidence: Any,
) -> Finding:
    """Build a Triton finding located in ``m``'s config.pbtxt."""
    return finding(
        info,
        message,
        Location(m.loc, element, line, column if line is not None else None),
        fix,
        evidence,
        severity=severity,
    )


def _tensors(m: TritonModel) -> list[tuple[str, Any]]:
    return [("input", t) for t in m.config.input] + [("output", t) for t in m.config.output]


@check("triton_model", codes=[C_PARSE])
def check_parse(m: TritonModel) -> Iterator[Finding]:
    if m.problem is None:
        return
    p = m.problem
    where = f" at line {p.line}, column {p.column}" if p.line is not None else ""
    lines = m.text.rstrip().splitlines()
    # protobuf reports a missing closer at the last token of the file
    at_end = p.line is not None and p.line >= len(lines) and p.message.startswith(("Expected", "''"))
    if at_end:
        where += " (end of file: a '[' or '{' is never closed)"
    yield tf(
        C_PARSE,
        m,
        f"config.pbtxt does not parse{where}: {p.message}",
        "fix the field at that position (compare with Triton's model_config.proto: field names, "
        "enum values like TYPE_FP32, strings in quotes)",
        line=p.line,
        column=p.column,
        error=p.message,
        line_number=p.line,
        column_number=p.column,
    )


@check("triton_model", codes=[C_NAME])
def check_name(m: TritonModel) -> Iterator[Finding]:
    if m.config is None or not m.config.name or m.config.name == m.name or m.config_path.name != "config.pbtxt":
        return
    yield tf(
        C_NAME,
        m,
        f"name {m.config.name!r} differs from the model directory {m.name!r}",
        f'set name: "{m.name}" (or rename the directory to {m.config.name!r})',
        element="name",
        line=m.line_of(r"^\s*name\s*:"),
        config_name=m.config.name,
        directory=m.name,
    )


def _bad_dims(dims: Sequence[int]) -> list[int]:
    return [d for d in dims if d == 0 or d < -1]


@check("triton_model", codes=[C_DIMS, C_RESHAPE, C_DTYPE, C_DUP])
def check_tensors(m: TritonModel) -> Iterator[Finding]:
    if m.config is None:
        return
    pb2 = model_config_pb2()
    seen: dict[str, set[str]] = {"input": set(), "output": set()}
    for kind, t in _tensors(m):
        dims = list(t.dims)
        line = m.line_of_tensor(t.name)
        el = f"{kind} {t.name}"
        if t.name in seen[kind]:
            yield tf(
                C_DUP,
                m,
                f"two {kind}s are named {t.name!r}",
                f"rename or remove one {kind} {t.name!r}",
                element=el,
                line=line,
                name=t.name,
            )
        seen[kind].add(t.name)
        if t.data_type == pb2.TYPE_INVALID:
            yield tf(
                C_DTYPE,
                m,
                f"{kind} {t.name!r} has no data_type",
                f"add data_type: TYPE_FP32 (or the model's type) to {kind} {t.name!r}",
                element=el,
                line=line,
                tensor=t.name,
            )
        bad = _bad_dims(dims)
        if bad:
            yield tf(
                C_DIMS,
                m,
                f"{kind} {t.name!r} has dims {dims}: {bad} not allowed (each dim >= 1 or -1)",
                "use -1 for a variable dim and a positive size otherwise",
                element=el,
                line=line,
                tensor=t.name,
                dims=dims,
                bad_dims=bad,
            )
        has_reshape = t.HasField("reshape")
        if not dims and not has_reshape and not (kind == "input" and t.is_shape_tensor):
            yield tf(
                C_DIMS,
                m,
                f"{kind} {t.name!r} has no dims",
                "list the dims without the batch dim, e.g. dims: [ 3, -1, -1 ] "
                "(for a scalar per batch item use dims: [ 1 ] with reshape: { shape: [ ] })",
                element=el,
                line=line,
                tensor=t.name,
                dims=dims,
            )
        if has_reshape and not bad:
            shape = list(t.reshape.shape)
            bad_shape = _bad_dims(shape)
            var_d, var_s = dims.count(-1), shape.count(-1)
            static_d = math.prod(d for d in dims if d != -1)
            static_s = math.prod(d for d in shape if d != -1)
            if bad_shape or var_d != var_s or (var_d == 0 and static_d != static_s):
                yield tf(
                    C_RESHAPE,
                    m,
                    f"{kind} {t.name!r}: dims {dims} ({static_d} elements"
                    f"{', ' + str(var_d) + ' variable' if var_d else ''}) cannot be reshaped to {shape} "
                    f"({static_s} elements{', ' + str(var_s) + ' variable' if var_s else ''})",
                    "make reshape.shape hold the same number of elements as dims (and the same number of -1 dims)",
                    element=f"{el}.reshape",
                    line=line,
                    tensor=t.name,
                    dims=dims,
                    reshape=shape,
                    dims_elements=static_d,
                    reshape_elements=static_s,
                )


@check("triton_model", codes=[C_MBS, C_DYN, C_PREF])
def check_batching(m: TritonModel) -> Iterator[Finding]:
    if m.config is None:
        return
    c = m.config
    mbs = int(c.max_batch_size)
    line = m.line_of(r"^\s*max_batch_size\s*:")
    if mbs < 0:
        yield tf(
            C_MBS,
            m,
            f"max_batch_size is {mbs}",
            "set max_batch_size: 0 (no batching) or a positive limit",
            element="max_batch_size",
            line=line,
            max_batch_size=mbs,
        )
        return
    if c.HasField("dynamic_batching"):
        dline = m.line_of(r"dynamic_batching")
        if mbs == 0:
            yield tf(
                C_DYN,
                m,
                "dynamic_batching is set but max_batch_size is 0, so the model cannot batch",
                "set max_batch_size > 0 (and make the model's first dim dynamic), or remove dynamic_batching",
                element="dynamic_batching",
                line=dline,
                max_batch_size=mbs,
            )
        else:
            bad = [p for p in c.dynamic_batching.preferred_batch_size if p > mbs or p < 1]
            if bad:
                yield tf(
                    C_PREF,
                    m,
                    f"preferred_batch_size {list(c.dynamic_batching.preferred_batch_size)} "
                    f"has {bad} outside 1..max_batch_size={mbs}",
                    f"keep preferred sizes <= {mbs} or raise max_batch_size to {max(bad)}",
                    element="dynamic_batching.preferred_batch_size",
                    line=m.line_of(r"preferred_batch_size") or dline,
                    preferred_batch_size=list(c.dynamic_batching.preferred_batch_size),
                    max_batch_size=mbs,
                    out_of_range=bad,
                )


@check("triton_model", codes=[C_INSTANCE])
def check_instance_groups(m: TritonModel) -> Iterator[Finding]:
    if m.config is None:
        return
    pb2 = model_config_pb2()
    groups = list(m.config.instance_group)
    line = m.line_of(r"instance_group")
    if groups and m.config.platform == "ensemble":
        yield tf(
            C_INSTANCE,
            m,
            "an ensemble declares instance_group; ensembles have no instances",
            "remove instance_group from the ensemble (set it on the step models)",
            element="instance_group",
            line=line,
            groups=len(groups),
        )
    for i, g in enumerate(groups):
        kind = pb2.ModelInstanceGroup.Kind.Name(g.kind)
        el = f"instance_group[{i}]" + (f" {g.name}" if g.name else "")
        if g.kind in (pb2.ModelInstanceGroup.KIND_CPU, pb2.ModelInstanceGroup.KIND_MODEL) and g.gpus:
            yield tf(
                C_INSTANCE,
                m,
                f"{el} is {kind} but lists gpus {list(g.gpus)}",
                f"remove gpus from {el} or use kind: KIND_GPU",
                element=el,
                line=line,
                kind=kind,
                gpus=list(g.gpus),
            )
        negative = [x for x in g.gpus if x < 0]
        if negative:
            yield tf(
                C_INSTANCE,
                m,
                f"{el} lists negative GPU ids {negative}",
                "use GPU ids >= 0",
                element=el,
                line=line,
                gpus=list(g.gpus),
            )
        if g.count < 0:
            yield tf(
                C_INSTANCE,
                m,
                f"{el} has count {g.count}",
                "use count >= 1",
                element=el,
                line=line,
                count=g.count,
            )


@check("triton_model", codes=[C_VERSION])
def check_versions(m: TritonModel) -> Iterator[Finding]:
    if m.config is None or m.config_path.name != "config.pbtxt":
        return
    present = sorted(m.versions)
    policy = m.config.version_policy
    choice = policy.WhichOneof("policy_choice") or "latest"
    line = m.line_of(r"version_policy")
    if not present:
        yield tf(
            C_VERSION,
            m,
            f"model {m.name!r} has no numeric version folder; Triton loads no version",
            f"put the model in {m.dir / '1'}/ (ensembles need an empty 1/ folder too)",
            element="version_policy",
            line=line,
            policy=choice,
            versions_present=present,
        )
        return
    if choice == "specific":
        wanted = list(policy.specific.versions)
        missing = [v for v in wanted if v not in m.versions]
        if missing:
            yield tf(
                C_VERSION,
                m,
                f"version_policy.specific lists versions {missing} with no folder (present: {present})",
                f"create folder(s) {', '.join(str(v) for v in missing)}/ or list only {present}",
                element="version_policy.specific",
                line=line,
                policy="specific",
                versions_wanted=wanted,
                versions_present=present,
                missing=missing,
            )
    elif choice == "latest":
        n = int(policy.latest.num_versions) or 1
        if n > len(present):
            yield tf(
                C_VERSION,
                m,
                f"version_policy.latest asks for {n} versions but only {len(present)} folder(s) exist ({present})",
                f"set num_versions: {len(present)} or add versions",
                element="version_policy.latest",
                line=line,
                severity=W,
                policy="latest",
                num_versions=n,
                versions_present=present,
            )


def _guess_backend(m: TritonModel) -> str | None:
    for files in m.versions.values():
        for f in files:
            for suffix, backend in _SUFFIX_BACKEND.items():
                if f.endswith(suffix):
                    return backend
    return None


def expected_model_file(m: TritonModel) -> tuple[str | None, str | None]:
    """(backend, file name Triton opens in each version folder) for ``m``."""
    c = m.config
    backend = c.backend or (PLATFORMS.get(c.platform, ("", None))[0] if c.platform else None)
    if not backend and not c.platform:
        backend = _guess_backend(m)
    default = None
    if c.platform in PLATFORMS:
        default = PLATFORMS[c.platform][1]
    elif backend:
        default = BACKEND_FILES.get(backend)
    return backend, (c.default_model_filename or default)


@check("triton_model", codes=[C_PLATFORM, C_FILE, C_BACKEND, C_NO_IO])
def check_platform_and_files(m: TritonModel) -> Iterator[Finding]:
    if m.config is None:
        return
    c = m.config
    pline = m.line_of(r"^\s*(platform|backend)\s*:")
    if c.platform and c.platform not in PLATFORMS:
        yield tf(
            C_PLATFORM,
            m,
            f"platform {c.platform!r} is not a Triton platform",
            f"use one of {sorted(PLATFORMS)} or set backend: instead",
            element="platform",
            line=pline,
            platform=c.platform,
            known=sorted(PLATFORMS),
        )
        return
    if c.platform and c.backend and c.platform != "ensemble" and PLATFORMS[c.platform][0] != c.backend:
        yield tf(
            C_PLATFORM,
            m,
            f"platform {c.platform!r} runs on backend {PLATFORMS[c.platform][0]!r} but backend is {c.backend!r}",
            f'remove one of them (e.g. keep backend: "{c.backend}")',
            element="backend",
            line=pline,
            platform=c.platform,
            backend=c.backend,
        )
        return
    if c.backend and c.backend not in BACKEND_FILES:
        yield tf(
            C_BACKEND,
            m,
            f"backend {c.backend!r} is not a stock Triton backend",
            f"make sure <backend-dir>/{c.backend}/libtriton_{c.backend}.so (or model.py for python-based "
            "backends) exists on the server, or fix the name",
            element="backend",
            line=pline,
            backend=c.backend,
            stock=sorted(BACKEND_FILES),
        )
    backend, filename = expected_model_file(m)
    if not c.platform and not c.backend and backend is None:
        yield tf(
            C_PLATFORM,
            m,
            "neither platform nor backend is set and no model file lets Triton guess",
            'add backend: "onnxruntime" (or the right backend)',
            element="backend",
            files={str(v): f for v, f in m.versions.items()},
        )
        return
    if c.platform != "ensemble" and backend not in ("tensorrt",) and not c.input and not c.output:
        yield tf(
            C_NO_IO,
            m,
            "no input/output declared; this only loads with Triton's auto-complete",
            "declare every input and output with name, data_type and dims",
            element="input",
        )
    if filename is None or c.platform == "ensemble":
        return
    for version, files in m.versions.items():
        if filename not in files:
            yield tf(
                C_FILE,
                m,
                f"version folder {version}/ has no {filename!r} (found: {files or 'nothing'})",
                f"put the model at {m.dir / str(version) / filename}"
                + (" or set default_model_filename" if files else ""),
                element=f"{version}/{filename}",
                line=m.line_of(r"default_model_filename") or pline,
                version=version,
                expected_file=filename,
                files=files,
                backend=backend,
            )
