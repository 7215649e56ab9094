"""Cross-check a Triton config against the ONNX model in each version folder.

Names, dtypes (TYPE_FP32 <-> tensor(float) ...), dims with and without the batch
dim, a fixed first dim while max_batch_size > 0, and a config that lists the
batch dim inside ``dims``. Codes: TRITON020-TRITON025.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from usg.doctor.findings import Finding, RootCause, Severity
from usg.doctor.onnx.checks import load_onnx
from usg.doctor.registry import CodeInfo, check
from usg.doctor.runner import CheckContext
from usg.doctor.triton.checks import expected_model_file, tf
from usg.doctor.triton.config import DTYPE_TO_ONNX, TritonModel, dtype_name

__all__ = ["OnnxTensor", "onnx_io"]

E, W = Severity.ERROR, Severity.WARNING

C_NAMES = CodeInfo(
    "TRITON020",
    E,
    RootCause.CONFIG_INVALID,
    "config tensor names differ from the model's",
    "A config input/output does not exist in the ONNX model, or a model input is missing "
    "from the config; Triton refuses to load the model.",
)
C_DTYPE = CodeInfo(
    "TRITON021",
    E,
    RootCause.DTYPE_OR_RANGE,
    "config data_type differs from the model's",
    "The config's TYPE_* does not match the ONNX tensor's element type.",
)
C_DIMS = CodeInfo(
    "TRITON022",
    E,
    RootCause.SHAPE_OR_RANK,
    "config dims differ from the model's",
    "The config dims (plus the batch dim when max_batch_size > 0) do not match the ONNX tensor's shape.",
)
C_FIXED = CodeInfo(
    "TRITON023",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "max_batch_size > 0 but the model's batch dim is fixed",
    "Triton prepends a variable batch dim when max_batch_size > 0; the ONNX model's first dim must then be dynamic.",
)
C_BATCH_IN_DIMS = CodeInfo(
    "TRITON024",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "batch dim listed inside dims",
    "With max_batch_size > 0 the dims must leave out the batch dim; here they include it, so the rank is one too many.",
)
C_UNREADABLE = CodeInfo(
    "TRITON025",
    W,
    RootCause.CONFIG_INVALID,
    "model file not cross-checked",
    "The ONNX file in the version folder could not be read, so the config was not "
    "compared with it (see the ONNX findings for that file).",
)


@dataclass(frozen=True)
class OnnxTensor:
    name: str
    dtype: str  # onnx.TensorProto.DataType name: FLOAT, INT64, ...
    dims: list[int]  # -1 for dynamic


def onnx_io(model: onnx.ModelProto) -> tuple[dict[str, OnnxTensor], dict[str, OnnxTensor]]:
    """Inputs (initializers excluded) and outputs of ``model`` by name."""
    inits = {t.name for t in model.graph.initializer}

    def conv(vi: onnx.ValueInfoProto) -> OnnxTensor:
        t = vi.type.tensor_type
        dims = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]
        return OnnxTensor(vi.name, onnx.TensorProto.DataType.Name(t.elem_type), dims)

    ins = {vi.name: conv(vi) for vi in model.graph.input if vi.name not in inits}
    outs = {vi.name: conv(vi) for vi in model.graph.output}
    return ins, outs


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    bare = onnx.ModelProto()
    bare.graph.input.extend(model.graph.input)
    return bare


def implicit_inputs(config: Any) -> set[str]:
    """Model inputs Triton feeds without an ``input [...]`` entry.

    Sequence-batching control inputs (START, END, READY, CORRID) and implicit state, and the
    ragged ``batch_input`` targets: the ONNX Runtime backend binds them to model inputs by name.
    """
    seq = config.sequence_batching
    names = {c.name for c in seq.control_input} | {s.input_name for s in seq.state}
    names |= {target for b in config.batch_input for target in b.target_name}  # a repeated field
    return {n for n in names if n}


def _dims_match(config: list[int], model: list[int]) -> bool:
    return len(config) == len(model) and all(m == -1 or c == m for c, m in zip(config, model, strict=True))


@check("triton_model", codes=[C_NAMES, C_DTYPE, C_DIMS, C_FIXED, C_BATCH_IN_DIMS, C_UNREADABLE])
def check_against_onnx(m: TritonModel, ctx: CheckContext) -> Iterator[Finding]:
    if m.config is None or m.config_path.name != "config.pbtxt":
        return
    backend, filename = expected_model_file(m)
    if backend != "onnxruntime" or not filename:
        return
    for version in m.versions:
        path = m.dir / str(version) / filename
        if path.is_file():
            yield from _crosscheck(m, version, path, ctx)


def _crosscheck(m: TritonModel, version: int, path: Path, ctx: CheckContext) -> Iterator[Finding]:
    subject = load_onnx(path, ctx)
    if subject.model is None:
        yield tf(
            C_UNREADABLE,
            m,
            f"{version}/{path.name} cannot be read, config not cross-checked",
            f"fix the ONNX file first (usg doctor {path})",
            element=f"{version}/{path.name}",
            file=str(path),
            error=subject.load_error,
        )
        return
    ins, outs = onnx_io(subject.model)
    # an initializer also listed as a graph input can be fed (overridden): Triton's ONNX Runtime
    # backend accepts it as an (optional) config input (qa/L0_initializer_as_input)
    inits = {t.name for t in subject.model.graph.initializer}
    overridable = {n: t for n, t in onnx_io(_without_initializers(subject.model))[0].items() if n in inits}
    mbs = int(m.config.max_batch_size)
    model_file = f"{version}/{path.name}"
    declared_inputs = {t.name for t in m.config.input} | implicit_inputs(m.config)
    for kind, tensors, table in (("input", m.config.input, {**ins, **overridable}), ("output", m.config.output, outs)):
        for t in tensors:
            line = m.line_of_tensor(t.name)
            el = f"{kind} {t.name}"
            ot = table.get(t.name)
            if ot is None:
                yield tf(
                    C_NAMES,
                    m,
                    f"config {kind} {t.name!r} is not an {kind} of {model_file} (model {kind}s: {sorted(table)})",
                    f"rename it to one of {sorted(table)}",
                    element=el,
                    line=line,
                    tensor=t.name,
                    model_file=model_file,
                    model_tensors=sorted(table),
                )
                continue
            cfg_dtype = dtype_name(t.data_type)
            if DTYPE_TO_ONNX.get(cfg_dtype) != ot.dtype:
                want = next((k for k, v in DTYPE_TO_ONNX.items() if v == ot.dtype), f"(ONNX {ot.dtype})")
                yield tf(
                    C_DTYPE,
                    m,
                    f"{kind} {t.name!r} is {cfg_dtype} in the config but tensor({ot.dtype.lower()}) in {model_file}",
                    f"set data_type: {want}",
                    element=el,
                    line=line,
                    tensor=t.name,
                    config_dtype=cfg_dtype,
                    model_dtype=ot.dtype,
                    model_file=model_file,
                )
            if kind == "input" and t.allow_ragged_batch:
                yield from _ragged_findings(m, t.name, ot, model_file, line)
            elif mbs >= 0:  # a negative max_batch_size is TRITON005: whether dims hold the batch is unknown
                yield from _dims_findings(m, kind, t, ot, mbs, model_file, line)
    missing = sorted(set(ins) - declared_inputs)
    if m.config.input and missing:
        yield tf(
            C_NAMES,
            m,
            f"{model_file} has input(s) {missing} the config does not declare",
            "declare them in input [ ... ] with their data_type and dims",
            element=f"input {missing[0]}",
            line=m.line_of(r"^\s*input\s*\["),
            missing=missing,
            model_file=model_file,
            model_inputs=sorted(ins),
        )


def _ragged_findings(m: TritonModel, name: str, ot: OnnxTensor, model_file: str, line: int | None) -> Iterator[Finding]:
    """A ragged input (``allow_ragged_batch``) reaches the model as one flat tensor of every request's
    elements, so its dims are not compared; Triton's ONNX Runtime backend requires the model shape [-1]."""
    if ot.dims != [-1]:
        yield tf(
            C_DIMS,
            m,
            f"input {name!r} has allow_ragged_batch: true, so Triton feeds it flattened (shape [-1]), but "
            f"{model_file} declares shape {ot.dims}",
            f"export input {name!r} as a 1-D tensor with a dynamic length (shape [-1]), or remove allow_ragged_batch",
            element=f"input {name}",
            line=line,
            tensor=name,
            model_shape=ot.dims,
            allow_ragged_batch=True,
            model_file=model_file,
        )


def _dims_findings(
    m: TritonModel, kind: str, t: object, ot: OnnxTensor, mbs: int, model_file: str, line: int | None
) -> Iterator[Finding]:
    dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)  # type: ignore[attr-defined]
    name = ot.name
    el = f"{kind} {name}"
    ev: dict[str, Any] = {
        "tensor": name,
        "config_dims": dims,
        "model_shape": ot.dims,
        "max_batch_size": mbs,
        "model_file": model_file,
    }
    if mbs > 0:
        if not ot.dims:
            yield tf(
                C_DIMS,
                m,
                f"{kind} {name!r} is a scalar in {model_file} but max_batch_size is {mbs}",
                "set max_batch_size: 0",
                element=el,
                line=line,
                **ev,
            )
            return
        if ot.dims[0] != -1:
            yield tf(
                C_FIXED,
                m,
                f"max_batch_size is {mbs} but {kind} {name!r} in {model_file} has a fixed "
                f"first dim {ot.dims[0]} (shape {ot.dims}); Triton will send batches of up to {mbs}",
                f"set max_batch_size: 0 and dims: {ot.dims}, or re-export with a dynamic batch "
                "dim (dynamic_axes={0: 'batch'})",
                element=el,
                line=line or m.line_of("max_batch_size"),
                **ev,
            )
            return
        if len(dims) == len(ot.dims) and _dims_match(dims[1:], ot.dims[1:]):
            yield tf(
                C_BATCH_IN_DIMS,
                m,
                f"{kind} {name!r} dims {dims} include the batch dim: with "
                f"max_batch_size {mbs} Triton sees shape [-1, {', '.join(map(str, dims))}] vs the "
                f"model's {ot.dims}",
                f"drop the first dim: dims: {dims[1:]}",
                element=el,
                line=line,
                **ev,
            )
            return
        if not _dims_match(dims, ot.dims[1:]):
            yield tf(
                C_DIMS,
                m,
                f"{kind} {name!r}: config dims {dims} (batch added: [-1, "
                f"{', '.join(map(str, dims))}]) do not match {model_file} shape {ot.dims}",
                f"set dims: {ot.dims[1:]}",
                element=el,
                line=line,
                **ev,
            )
    elif not _dims_match(dims, ot.dims):
        yield tf(
            C_DIMS,
            m,
            f"{kind} {name!r}: config dims {dims} do not match {model_file} shape {ot.dims} "
            "(max_batch_size 0: dims are the full shape)",
            f"set dims: {ot.dims}",
            element=el,
            line=line,
            **ev,
        )
