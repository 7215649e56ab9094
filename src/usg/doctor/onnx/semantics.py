"""ONNX checks, part 2: models that load and run but misbehave once deployed.

Frozen batch dims, static outputs from dynamic inputs, Resize modes read
differently by PyTorch / ONNX Runtime / TensorRT, fp16 overflow-prone reductions,
int64 inputs that TensorRT narrows. Codes: ONNX008-ONNX013.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import numpy_helper

from usg.doctor.findings import Finding, RootCause, Severity
from usg.doctor.onnx.checks import OnnxSubject, _f
from usg.doctor.onnx.probe import run_once
from usg.doctor.registry import CodeInfo, check
from usg.doctor.runner import CheckContext

__all__ = ["RESIZE_DRIFT", "ResizeDrift"]

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO

C_FIXED_BATCH = CodeInfo(
    "ONNX008",
    W,
    RootCause.DYNAMIC_SHAPE_FIXED,
    "input with a fixed batch dim",
    "The first dim of an input is a number, so servers cannot batch requests.",
)
C_FROZEN = CodeInfo(
    "ONNX009",
    E,
    RootCause.DYNAMIC_SHAPE_FIXED,
    "batch size frozen into Reshape/Expand",
    "A Reshape/Expand shape constant repeats the fixed batch size: the export traced it "
    "as a constant, so even making the input dim dynamic breaks at batch != that size.",
)
C_STATIC_OUT = CodeInfo(
    "ONNX010",
    W,
    RootCause.DYNAMIC_SHAPE_FIXED,
    "static output from dynamic inputs",
    "An output has only fixed dims although an input's batch dim is dynamic: the "
    "output shape was traced, and batch > 1 will fail or be wrong.",
)
C_RESIZE = CodeInfo(
    "ONNX011",
    W,
    RootCause.OP_SEMANTIC_DRIFT,
    "Resize mode that differs across runtimes",
    "A Resize/Upsample coordinate_transformation_mode / mode / nearest_mode combination "
    "that PyTorch eager, ONNX Runtime and TensorRT compute differently (an error when "
    "deploying to TensorRT and its parser refuses the combination).",
    also_severities=(E,),
)
C_FP16 = CodeInfo(
    "ONNX012",
    W,
    RootCause.DTYPE_OR_RANGE,
    "fp16 reduction overflow risk",
    "LayerNorm / Softmax / ReduceSum-family ops computed in float16 overflow (>65504) or "
    "lose precision on long sequences; keep them in float32.",
)
C_INT64 = CodeInfo(
    "ONNX013",
    N,
    RootCause.DTYPE_OR_RANGE,
    "int64 input (TensorRT narrows to int32)",
    "TensorRT casts int64 inputs to int32; ids or offsets >= 2**31 wrap around (a warning when deploying to TensorRT).",
    also_severities=(W,),
)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value) if d.dim_value >= 0 else None)  # -1 written by some exporters
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _constants(model: onnx.ModelProto) -> dict[str, Any]:
    """Name -> numpy value of every initializer and Constant node output."""
    out: dict[str, Any] = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type == onnx.TensorProto.INT64:
            out[t.name] = numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == onnx.TensorProto.INT64:
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_ints":
                    out[n.output[0]] = list(a.ints)
    return out


def _first(value: Any) -> int | None:
    flat = [int(x) for x in (value.reshape(-1).tolist() if hasattr(value, "reshape") else value)]
    return flat[0] if flat else None


def _dynamic(d: int | str | None) -> bool:
    return not isinstance(d, int)


def _batch_carriers(model: onnx.ModelProto, source: str) -> set[str]:
    """Tensors computed from ``source``'s data (not from its shape: Shape/Size end the flow)."""
    reach = {source}
    for n in model.graph.node:
        if n.op_type not in ("Shape", "Size") and any(x in reach for x in n.input):
            reach.update(o for o in n.output if o)
    return reach


def _frozen_nodes(model: onnx.ModelProto, name: str, batch: int, consts: dict[str, Any]) -> list[dict[str, Any]]:
    """Reshape/Expand nodes that reshape ``name``'s data to a constant shape starting with ``batch``.

    Index tensors built from Range/Constant (attention masks, position ids) do not carry the batch,
    so a leading ``batch`` in their shape is no evidence of a traced batch size.
    """
    carriers = _batch_carriers(model, name)
    frozen = []
    for n in model.graph.node:
        if n.op_type not in ("Reshape", "Expand") or len(n.input) < 2 or n.input[1] not in consts:
            continue
        if n.op_type == "Expand" and batch == 1:
            continue  # expanding to 1 is a broadcast no-op, not evidence of tracing
        if n.input[0] in carriers and _first(consts[n.input[1]]) == batch:
            shape = consts[n.input[1]]
            frozen.append(
                {
                    "node": n.name or n.output[0],
                    "op_type": n.op_type,
                    "shape": [int(x) for x in (shape.tolist() if hasattr(shape, "tolist") else shape)],
                }
            )
    return frozen


def _state_batch_axis(dims: list[int | str | None], batch_symbols: set[str | None]) -> int | None:
    """The batch axis of a recurrent-state input laid out ``[layers, batch, hidden]`` (silero-vad's
    ``state [2, batch, 128]``): a dynamic axis after a fixed dim 0, in a model whose other inputs
    batch on a dynamic dim 0 (with the same symbol when both are named)."""
    if not batch_symbols:
        return None
    for axis, d in enumerate(dims[1:], 1):
        if _dynamic(d) and (d is None or d in batch_symbols or None in batch_symbols):
            return axis
    return None


def _probe_batch(s: OnnxSubject, names: list[str], batch: int) -> dict[str, Any] | None:
    """Run at the model's own batch, then at ``batch + 1`` with the named inputs made dynamic.

    None when no run is feasible or the model does not even run at its own shapes (inconclusive).
    """
    assert s.model is not None
    base = run_once(s.model, size=s.size)
    if base is None or not base.ok:
        return None
    other = run_once(s.model, batch=batch + 1, batch_inputs=names, size=s.size)
    if other is None:
        return None
    return {"batch": batch + 1, "runs": other.ok, "error": other.error}


@check("onnx", codes=[C_FIXED_BATCH, C_FROZEN])
def check_fixed_batch(s: OnnxSubject) -> Iterator[Finding]:
    """Inputs with a fixed batch dim (ONNX008), and a batch size traced into Reshape/Expand (ONNX009).

    A suspected frozen batch is run at another batch size where feasible: if the model runs, the
    batch was not frozen (ONNX008 only); if it fails, the error is the proof. One ONNX009 per model.
    """
    if s.model is None:
        return
    inputs = [(inp.name, _dims(inp)) for inp in _real_inputs(s.model)]
    batch_symbols: set[str | None] = {d[0] for _, d in inputs if d and len(d) >= 2 and not isinstance(d[0], int)}
    fixed = [(n, d) for n, d in inputs if d and len(d) >= 2 and isinstance(d[0], int) and d[0] > 0]
    if not fixed:
        return
    consts = _constants(s.model)
    frozen: dict[str, list[dict[str, Any]]] = {}
    for name, dims in fixed:
        if _state_batch_axis(dims, batch_symbols) is None:
            nodes = _frozen_nodes(s.model, name, int(dims[0] or 0), consts)
            if nodes:
                frozen[name] = nodes
    probe = None
    if frozen:
        first = next(d for n, d in fixed if n in frozen)
        probe = _probe_batch(s, list(frozen), int(first[0] or 0))
        if probe is None or not probe["runs"]:
            yield _frozen_finding(s, fixed, frozen, probe)
            return
    for name, dims in fixed:
        yield _fixed_batch_finding(s, name, dims, _state_batch_axis(dims, batch_symbols), probe)


def _frozen_finding(
    s: OnnxSubject,
    fixed: list[tuple[str, list[int | str | None]]],
    frozen: dict[str, list[dict[str, Any]]],
    probe: dict[str, Any] | None,
) -> Finding:
    name, dims = next((n, d) for n, d in fixed if n in frozen)
    batch = dims[0]
    nodes = list({n["node"]: n for ns in frozen.values() for n in ns}.values())
    proof = (
        f"; at batch {probe['batch']} ONNX Runtime fails: {probe['error']}"
        if probe
        else " (not confirmed by a run: the model is too large or its inputs cannot be synthesised)"
    )
    axes = ", ".join(f"'{n}': {{0: 'batch'}}" for n in frozen)
    return _f(
        C_FROZEN,
        s,
        f"input(s) {sorted(frozen)} have fixed batch {batch} and {len(nodes)} Reshape/Expand "
        f"node(s) reshape their data to a shape starting with {batch}: the trace froze the batch size" + proof,
        "re-export with dynamic_axes={" + axes + "} (or dynamic_shapes) and "
        "build shapes from x.shape[0] / use -1 in view()/reshape() instead of a Python int",
        element=name,
        input=name,
        inputs=sorted(frozen),
        shape=dims,
        batch=batch,
        frozen_nodes=nodes[:10],
        batch_probe=probe,
    )


def _fixed_batch_finding(
    s: OnnxSubject, name: str, dims: list[int | str | None], state_axis: int | None, probe: dict[str, Any] | None
) -> Finding:
    batch = dims[0]
    extra: dict[str, Any] = {"batch_probe": probe} if probe else {}
    if state_axis is not None:
        return _f(
            C_FIXED_BATCH,
            s,
            f"input {name!r} (shape {dims}) carries the batch on axis {state_axis}, not 0 (a recurrent-state "
            "layout): servers that batch along axis 0, like Triton's dynamic batcher, cannot batch it",
            "serve it unbatched (max_batch_size: 0) and batch on the client, or wrap the model so the state "
            f"is batch-first (transpose axis {state_axis} to 0)",
            element=name,
            input=name,
            shape=dims,
            batch_axis=state_axis,
        )
    return _f(
        C_FIXED_BATCH,
        s,
        f"input {name!r} has a fixed batch dim {batch} (shape {dims}); requests cannot be batched"
        + (f" (the model runs at batch {probe['batch']} once the dim is dynamic)" if probe else ""),
        "re-export with dynamic_axes={'" + name + "': {0: 'batch'}}, or keep max_batch_size: 0 in serving configs",
        element=name,
        input=name,
        shape=dims,
        batch=batch,
        **extra,
    )


@check("onnx", codes=[C_STATIC_OUT])
def check_static_outputs(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None:
        return
    dynamic_inputs = []
    for inp in _real_inputs(s.model):
        dims = _dims(inp)
        if dims and not isinstance(dims[0], int):
            dynamic_inputs.append(inp.name)
    if not dynamic_inputs:
        return
    for out in s.model.graph.output:
        dims = _dims(out)
        if dims and all(isinstance(d, int) for d in dims):
            yield _f(
                C_STATIC_OUT,
                s,
                f"output {out.name!r} has static shape {dims} while input(s) {dynamic_inputs} have a dynamic batch dim",
                "export with dynamic_axes for the output too (e.g. {'" + out.name + "': {0: 'batch'}}) "
                "and check the model at batch 2",
                element=out.name,
                output=out.name,
                output_shape=dims,
                dynamic_inputs=dynamic_inputs,
            )


@dataclass(frozen=True)
class ResizeDrift:
    """What produces a Resize configuration and how runtimes disagree on it."""

    produced_by: str
    drift: str
    fix: str
    trt_refuses: bool = False


RESIZE_DRIFT: dict[tuple[str, str], ResizeDrift] = {
    ("linear", "asymmetric"): ResizeDrift(
        "nn.Upsample(mode='bilinear') exported at opset <= 10 (Upsample op), or TF resize_bilinear "
        "with half_pixel_centers=False",
        "ONNX Runtime and TensorRT (kASYMMETRIC) agree with each other, but PyTorch eager samples at "
        "half-pixel centres: the deployed output is shifted by half a pixel against the training model",
        "re-export at opset >= 11 with F.interpolate(mode='bilinear', align_corners=False)",
    ),
    ("linear", "pytorch_half_pixel"): ResizeDrift(
        "F.interpolate(mode='bilinear', align_corners=False) through torch.onnx.export(dynamo=True)",
        "TensorRT's parser maps it to HALF_PIXEL, which differs from ONNX Runtime/PyTorch whenever an "
        "output axis has length 1 (PyTorch samples source pixel 0, TensorRT the centre)",
        "avoid resizing to length-1 axes, or compare TensorRT vs ONNX Runtime outputs with usg doctor parity",
    ),
    ("cubic", "asymmetric"): ResizeDrift(
        "nn.Upsample(mode='bicubic') exported at opset <= 10, or TF resize_bicubic",
        "PyTorch eager uses half-pixel centres and A=-0.75; asymmetric + TF's A=-0.5 gives visibly "
        "different pixels in ONNX Runtime and TensorRT",
        "re-export at opset >= 11 with F.interpolate(mode='bicubic', align_corners=False)",
    ),
    ("cubic", "pytorch_half_pixel"): ResizeDrift(
        "F.interpolate(mode='bicubic', align_corners=False) through the dynamo exporter",
        "TensorRT maps it to HALF_PIXEL (different at length-1 axes) and before 8.6 fixes cubic A to -0.75",
        "compare TensorRT vs ONNX Runtime outputs with usg doctor parity",
    ),
    ("nearest", "align_corners"): ResizeDrift(
        "a hand-edited graph or TF resize_nearest_neighbor(align_corners=True); PyTorch never emits it",
        "ONNX Runtime and TensorRT round the align_corners source index differently (nearest_mode "
        "is honoured by ORT, TensorRT < 8.5 always rounds half down)",
        "use coordinate_transformation_mode='asymmetric' with nearest_mode='floor' "
        "(what F.interpolate(mode='nearest') exports)",
    ),
    ("nearest", "half_pixel"): ResizeDrift(
        "F.interpolate(mode='nearest-exact'), or a graph edited to half_pixel",
        "PyTorch 'nearest' is asymmetric+floor; half_pixel with round_prefer_floor rounds .5 differently "
        "from PyTorch and TensorRT < 8.5 ignores nearest_mode",
        "for F.interpolate(mode='nearest') use asymmetric + nearest_mode='floor'; otherwise verify with "
        "usg doctor parity",
    ),
    ("nearest", "tf_half_pixel_for_nn"): ResizeDrift(
        "TF1 resize_nearest_neighbor(half_pixel_centers=True) via tf2onnx",
        "TensorRT does not implement tf_half_pixel_for_nn and refuses the node",
        "re-convert with tf2onnx at opset >= 13 so it emits half_pixel",
        trt_refuses=True,
    ),
    ("linear", "tf_crop_and_resize"): ResizeDrift(
        "tf.image.crop_and_resize via tf2onnx",
        "TensorRT does not implement tf_crop_and_resize; ONNX Runtime does (extrapolation_value)",
        "run the crop outside the model (e.g. a RoIAlign node or a preprocessing step)",
        trt_refuses=True,
    ),
}
_ANTIALIAS = ResizeDrift(
    "F.interpolate(..., antialias=True) (opset 18 Resize antialias=1)",
    "TensorRT does not support antialias=1 and ONNX Runtime < 1.15 ignores it",
    "resize with antialias in preprocessing, or export without antialias",
    trt_refuses=True,
)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _s(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _resize_key(mode: str, ctm: str) -> tuple[str, str]:
    # tf_crop_and_resize drifts the same way whatever the interpolation mode
    return ("linear", ctm) if ctm == "tf_crop_and_resize" else (mode, ctm)


@check("onnx", codes=[C_RESIZE])
def check_resize(s: OnnxSubject, ctx: CheckContext) -> Iterator[Finding]:
    if s.model is None:
        return
    groups: dict[tuple[str, str, str, int], list[str]] = {}
    for n in s.model.graph.node:
        if n.op_type not in ("Resize", "Upsample"):
            continue
        a = _attrs(n)
        mode = _s(a.get("mode"), "nearest")
        mode = "linear" if mode in ("bilinear", "trilinear") else mode
        # Upsample (opset <= 9) is always asymmetric
        ctm = "asymmetric" if n.op_type == "Upsample" else _s(a.get("coordinate_transformation_mode"), "half_pixel")
        nearest_mode = _s(a.get("nearest_mode"), "round_prefer_floor") if mode == "nearest" else "-"
        antialias = int(a.get("antialias", 0) or 0)
        if _resize_key(mode, ctm) in RESIZE_DRIFT or antialias:
            groups.setdefault((mode, ctm, nearest_mode, antialias), []).append(n.name or n.output[0])
    trt = ctx.targets.get("tensorrt")
    for (mode, ctm, nearest_mode, antialias), nodes in sorted(groups.items()):
        info = _ANTIALIAS if antialias else RESIZE_DRIFT[_resize_key(mode, ctm)]
        # deploying to TensorRT, a node its parser refuses is an error, not a drift warning
        severity = E if trt is not None and info.trt_refuses else None
        yield _f(
            C_RESIZE,
            s,
            f"{len(nodes)} Resize node(s) use mode={mode}, "
            f"coordinate_transformation_mode={ctm}"
            + (f", nearest_mode={nearest_mode}" if mode == "nearest" else "")
            + (", antialias=1" if antialias else "")
            + f": {info.drift}",
            info.fix,
            element=nodes[0],
            severity=severity,
            mode=mode,
            coordinate_transformation_mode=ctm,
            nearest_mode=None if mode != "nearest" else nearest_mode,
            antialias=antialias,
            produced_by=info.produced_by,
            tensorrt=".".join(map(str, trt)) if trt else None,
            nodes=nodes[:10],
        )


_FP16_RISKY = frozenset(
    {
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "Softmax",
        "LogSoftmax",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceMean",
        "ReduceL2",
    }
)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    out = {t.name: t.data_type for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type"):
            out[vi.name] = vi.type.tensor_type.elem_type
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = a.t.data_type
    return out


@check("onnx", codes=[C_FP16])
def check_fp16_overflow(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None:
        return
    model = s.inferred or s.model
    types = _elem_types(model)
    if onnx.TensorProto.FLOAT16 not in types.values():
        return
    hits: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.op_type in _FP16_RISKY and n.input and types.get(n.input[0]) == onnx.TensorProto.FLOAT16:
            hits.setdefault(n.op_type, []).append(n.name or n.output[0])
    for op, nodes in sorted(hits.items()):
        yield _f(
            C_FP16,
            s,
            f"{len(nodes)} {op} node(s) run in float16: sums over long axes exceed 65504 "
            "or lose precision (NaN/inf after a few thousand tokens or large activations)",
            f"keep {op} in float32: convert with onnxconverter_common.float16.convert_float_to_float16"
            f"(model, op_block_list=['{op}']) or keep_io_types, or use mixed precision in TensorRT",
            element=nodes[0],
            op_type=op,
            dtype="float16",
            nodes=nodes[:10],
        )


@check("onnx", codes=[C_INT64])
def check_int64_inputs(s: OnnxSubject, ctx: CheckContext) -> Iterator[Finding]:
    if s.model is None:
        return
    trt = ctx.targets.get("tensorrt")
    for inp in _real_inputs(s.model):
        if inp.type.tensor_type.elem_type != onnx.TensorProto.INT64:
            continue
        severity = W if trt is not None else N
        yield _f(
            C_INT64,
            s,
            f"input {inp.name!r} is int64; TensorRT casts it to int32, so values "
            ">= 2**31 (hashes, large offsets) wrap around",
            f"export {inp.name!r} as int32 if its values fit (token ids do), or keep this model on ONNX Runtime",
            element=inp.name,
            severity=severity,
            input=inp.name,
            dtype="int64",
            shape=_dims(inp),
            tensorrt=".".join(map(str, trt)) if trt else None,
        )
