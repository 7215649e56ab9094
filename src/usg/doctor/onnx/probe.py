"""Run an ONNX model once on ONNX Runtime (CPU, one thread) to confirm what a static check suspects.

Static checks can only guess that a batch size was frozen or that a shape-inference failure
matters; a run settles it. :func:`run_once` feeds small synthetic inputs (dynamic and batch
dims set to the size asked for) and reports whether the session builds and runs. A run is only
tried where it is cheap and meaningful: no external weights, a model under
:data:`MAX_MODEL_BYTES`, numeric inputs of at most :data:`MAX_ELEMENTS` elements.
ONNX Runtime's own log lines are silenced (severity 4): the outcome is the finding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

__all__ = ["MAX_ELEMENTS", "MAX_MODEL_BYTES", "Probe", "run_once", "silence_onnxruntime"]

MAX_MODEL_BYTES = 64 * 2**20
MAX_ELEMENTS = 2**22
_BATCH_SYMBOL = "usg_probe_batch"


@dataclass(frozen=True)
class Probe:
    """The outcome of one run: ``ok``, or the first line of the error."""

    ok: bool
    error: str | None = None
    output_shapes: tuple[tuple[int, ...], ...] = ()


def silence_onnxruntime() -> None:
    """Keep ONNX Runtime's C++ logger off stderr (the doctor reports failures as findings)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)


def _external(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _feed(vi: onnx.ValueInfoProto, batch: int | None, rng: np.random.Generator) -> np.ndarray | None:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
    except Exception:
        return None
    if dtype.kind not in "fiub":
        return None
    shape = []
    for i, d in enumerate(t.shape.dim):
        if i == 0 and batch is not None:
            shape.append(batch)
        elif d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        else:
            shape.append(1)
    if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
        return None
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 0.1).astype(dtype)
    return np.zeros(shape, dtype=dtype)  # ids/indices: 0 is valid wherever an index is


def _with_dynamic_batch(model: onnx.ModelProto, inputs: Iterable[str]) -> onnx.ModelProto:
    """A copy whose ``inputs`` have a symbolic dim 0, with output dim 0 and value_info shapes dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = set(inputs)
    for vi in out.graph.input:
        if vi.name in names and vi.type.tensor_type.shape.dim:
            vi.type.tensor_type.shape.dim[0].dim_param = _BATCH_SYMBOL
    for vi in out.graph.output:
        if vi.type.tensor_type.shape.dim:
            vi.type.tensor_type.ClearField("shape")
    del out.graph.value_info[:]
    return out


def run_once(
    model: onnx.ModelProto, *, batch: int | None = None, batch_inputs: Iterable[str] = (), size: int = 0
) -> Probe | None:
    """Run ``model`` once; None when a run is not feasible (too big, external data, non-numeric inputs).

    With ``batch``, the inputs named in ``batch_inputs`` (and every input whose dim 0 is dynamic)
    get dim 0 = ``batch``; the named inputs are made symbolic in a copy of the model first.
    """
    if size > MAX_MODEL_BYTES or model.ByteSize() > MAX_MODEL_BYTES or _external(model):
        return None
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    named = set(batch_inputs)
    probe_model = _with_dynamic_batch(model, named) if named else model
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for vi in probe_model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        dynamic0 = bool(dims) and not (dims[0].HasField("dim_value") and dims[0].dim_value > 0)
        value = _feed(vi, batch if batch is not None and (vi.name in named or dynamic0) else None, rng)
        if value is None:
            return None
        feeds[vi.name] = value
    silence_onnxruntime()
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(probe_model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception as exc:
        text = str(exc).strip()
        return Probe(False, text.splitlines()[0][:400] if text else type(exc).__name__)
    return Probe(True, None, tuple(tuple(np.asarray(o).shape) for o in outs))
