"""Localisation for ``usg doctor parity``: which node froze a shape, which node drifts.

Frozen shapes
    A trace records Python ints as constants. When the ONNX model fails (or differs) at a size
    other than the export size, we name the node that holds the frozen value: first the node
    ONNX Runtime names in its error (``Reshape node. Name:'/Reshape'``), then every
    Reshape/Expand/Tile/ConstantOfShape/Slice whose shape-like input is a constant
    (initializer or ``Constant`` node) containing the export-time size of the axis that failed.

First diverging node (numeric drift)
    Two complementary methods, in this order:

    1. **Mapped to torch** (sound when the exporter kept module scopes, which both the legacy
       exporter — node names ``/encoder/layer.0/.../MatMul`` — and the dynamo exporter —
       ``pkg.torch.onnx.name_scopes`` metadata — do). Every ``nn.Module`` output is captured
       with forward hooks; for each module scope the ONNX values produced inside the scope and
       consumed outside it (its boundary values) are exposed as extra graph outputs. Modules are
       visited in the order torch *finished* them (children before parents); the first one
       whose output has a same-shape ONNX boundary value but none within tolerance is the first
       divergence: everything computed before it agreed, so the drift was introduced inside it.
    2. **Against a float64 run of the same graph** (used when no module diverges or no scope
       could be mapped). The graph is cast to float64 and evaluated with the ONNX reference
       evaluator (numpy), every node output exposed; the first node, in topological order,
       whose ONNX Runtime float32 output deviates beyond tolerance is where precision is lost.
       This finds kernel precision problems, not semantic drift (the reference shares the
       graph), which is why method 1 comes first.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from usg.doctor.parity.export import WRAPPED_SCOPE

__all__ = [
    "DRIFT_PRONE_OPS",
    "Divergence",
    "FrozenNode",
    "first_divergence_fp64",
    "first_divergent_module",
    "frozen_nodes",
    "node_scope",
]

# Ops whose semantics differ between runtimes often enough to name their attributes in a report.
DRIFT_PRONE_OPS = frozenset(
    {
        "Resize",
        "Upsample",
        "GridSample",
        "RoiAlign",
        "NonMaxSuppression",
        "Round",
        "Gelu",
        "LayerNormalization",
    }
)
_SHAPE_OPS = {"Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Slice": 2, "Resize": 3}
_ORT_NODE = re.compile(r"running (?P<op>\w+) node\. Name:'(?P<name>[^']*)'")


@dataclass(frozen=True)
class FrozenNode:
    node: str
    op_type: str
    constant: str | None
    values: tuple[int, ...]
    why: str


@dataclass
class Divergence:
    method: str  # "torch_modules" | "fp64_reference"
    where: str  # module path or ONNX node name
    onnx_nodes: list[str]
    max_abs_err: float
    detail: dict[str, Any] = field(default_factory=dict)


def _constants(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, str]]:
    out: dict[str, tuple[np.ndarray, str]] = {}
    for init in model.graph.initializer:
        out[init.name] = (numpy_helper.to_array(init), f"initializer {init.name}")
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = (numpy_helper.to_array(attr.t), node.name or node.output[0])
    return out


def frozen_nodes(
    model: onnx.ModelProto, export_size: int, axis: int | None, ort_message: str | None = None
) -> list[FrozenNode]:
    """Nodes that hold ``export_size`` as a constant shape value (see module docstring)."""
    found: list[FrozenNode] = []
    by_name = {n.name: n for n in model.graph.node}
    consts = _constants(model)
    if ort_message:
        m = _ORT_NODE.search(ort_message)
        if m and m["name"] in by_name:
            node = by_name[m["name"]]
            idx = _SHAPE_OPS.get(node.op_type)
            cname: str | None = None
            vals: tuple[int, ...] = ()
            if idx is not None and len(node.input) > idx and node.input[idx] in consts:
                arr, cname = consts[node.input[idx]]
                vals = tuple(int(v) for v in arr.reshape(-1)[:8])
            found.append(FrozenNode(node.name, node.op_type, cname, vals, "ONNX Runtime failed at this node"))
    for node in model.graph.node:
        idx = _SHAPE_OPS.get(node.op_type)
        if idx is None or len(node.input) <= idx or node.input[idx] not in consts:
            continue
        arr, const_name = consts[node.input[idx]]
        if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.size == 0:
            continue
        vals = tuple(int(v) for v in arr)
        hit = vals[axis] == export_size if axis is not None and axis < len(vals) else export_size in vals
        if hit and export_size not in (0, 1, -1) and all(f.node != node.name for f in found):
            found.append(
                FrozenNode(
                    node.name,
                    node.op_type,
                    const_name,
                    vals[:8],
                    f"constant shape holds the export size {export_size}",
                )
            )
    return found[:5]


def node_scope(node: onnx.NodeProto) -> str | None:
    """The ``nn.Module`` path a node came from, from dynamo metadata or a legacy ``/a/b/Op`` name."""
    comps: list[str] | None = None
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                parsed = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                parsed = None
            if isinstance(parsed, list):
                comps = [str(c) for c in parsed[1:-1] if c]
    if comps is None and node.name.startswith("/"):
        comps = [c for c in node.name.split("/")[1:-1] if c]
    if comps is None:
        return None
    if comps and comps[0] == WRAPPED_SCOPE:  # legacy export of a keyword-input model went through an adapter
        comps = comps[1:]
    path = ""
    for c in comps:
        path = c if (not path or c.startswith(path + ".")) else f"{path}.{c}"
    return path


def _in_scope(path: str | None, scope: str) -> bool:
    return path is not None and (path == scope or path.startswith(scope + "."))


def _boundaries(model: onnx.ModelProto, scopes: Iterable[str]) -> dict[str, list[str]]:
    nodes = list(model.graph.node)
    paths = [node_scope(n) for n in nodes]
    graph_outputs = {o.name for o in model.graph.output}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    out: dict[str, list[str]] = {}
    for scope in scopes:
        vals: list[str] = []
        for i, n in enumerate(nodes):
            if not _in_scope(paths[i], scope):
                continue
            for v in n.output:
                if v and (v in graph_outputs or any(not _in_scope(paths[j], scope) for j in consumers.get(v, []))):
                    vals.append(v)
        if vals:
            out[scope] = vals
    return out


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    existing = {o.name for o in extra.graph.output}
    for name in names:
        if name not in existing:
            extra.graph.output.append(helper.make_empty_tensor_value_info(name))
            existing.add(name)
    return extra


def _session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))


def _scope_nodes(model: onnx.ModelProto, scope: str) -> tuple[list[str], dict[str, Any]]:
    names: list[str] = []
    attrs: dict[str, Any] = {}
    for n in model.graph.node:
        if _in_scope(node_scope(n), scope):
            names.append(f"{n.op_type} {n.name}")
            if n.op_type in DRIFT_PRONE_OPS:
                attrs[n.name] = {
                    a.name: (a.s.decode() if a.type == onnx.AttributeProto.STRING else helper.get_attribute_value(a))
                    for a in n.attribute
                }
    return names, attrs


def first_divergent_module(
    model: onnx.ModelProto,
    torch_model: Any,
    run_torch: Any,
    feeds: Mapping[str, np.ndarray],
    atol: float,
    rtol: float,
) -> Divergence | None:
    """Method 1 of the module docstring. ``run_torch()`` runs the model once on the same inputs."""
    import torch

    captured: list[tuple[str, list[np.ndarray]]] = []

    def hook(name: str) -> Any:
        def fn(_mod: Any, _inp: Any, out: Any) -> None:
            tensors = [out] if isinstance(out, torch.Tensor) else [o for o in _flat(out) if isinstance(o, torch.Tensor)]
            captured.append((name, [t.detach().cpu().numpy() for t in tensors]))

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in torch_model.named_modules() if n]
    try:
        run_torch()
    finally:
        for h in handles:
            h.remove()
    scopes = {name for name, _ in captured}
    bounds = _boundaries(model, scopes)
    if not bounds:
        return None
    wanted = sorted({v for vals in bounds.values() for v in vals})
    sess = _session(_with_outputs(model, wanted))
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, dict(feeds)), strict=True))
    seen: set[str] = set()
    for name, tensors in captured:
        if name in seen or name not in bounds:
            continue
        seen.add(name)
        for t in tensors:
            cands = [values[v] for v in bounds[name] if v in values and np.shape(values[v]) == t.shape]
            if not cands or t.dtype.kind != "f":
                continue
            if any(_close(np.asarray(c), t, atol, rtol) for c in cands):
                continue
            nodes, attrs = _scope_nodes(model, name)
            err = min(_err(np.asarray(c), t) for c in cands)
            return Divergence("torch_modules", name, nodes, err, {"drift_prone_ops": attrs} if attrs else {})
    return None


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, Mapping):
        return [x for v in obj.values() for x in _flat(v)]
    if isinstance(obj, list | tuple):
        return [x for v in obj for x in _flat(v)]
    if hasattr(obj, "to_tuple"):
        return _flat(obj.to_tuple())
    return [obj]


def _to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    f32, f64 = TensorProto.FLOAT, TensorProto.DOUBLE

    def fix_vi(vis: Iterable[onnx.ValueInfoProto]) -> None:
        for vi in vis:
            if vi.type.tensor_type.elem_type == f32:
                vi.type.tensor_type.elem_type = f64

    fix_vi(m.graph.input)
    fix_vi(m.graph.output)
    del m.graph.value_info[:]
    for i, init in enumerate(m.graph.initializer):
        if init.data_type == f32:
            arr = numpy_helper.to_array(init).astype(np.float64)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, init.name))
    for node in m.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == f32:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float64), attr.t.name))
            elif attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == f32:
                attr.i = f64
    return m


def first_divergence_fp64(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], atol: float, rtol: float, max_nodes: int = 5000
) -> Divergence | None:
    """Method 2 of the module docstring; None when the graph is too big or the reference cannot run it."""
    from onnx.reference import ReferenceEvaluator

    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    if len(model.graph.node) > max_nodes:
        return None
    outs = [v for n in nodes for v in n.output if v]
    try:
        sess = _session(_with_outputs(model, outs))
        names = [o.name for o in sess.get_outputs()]
        got = dict(zip(names, sess.run(names, dict(feeds)), strict=True))
        ref_model = _with_outputs(_to_float64(model), outs)
        ref_feeds = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in feeds.items()}
        ref_names = [o.name for o in ref_model.graph.output]
        ref = dict(zip(ref_names, ReferenceEvaluator(ref_model).run(None, ref_feeds), strict=True))
    except Exception:
        return None
    for n in nodes:
        for v in n.output:
            a, b = got.get(v), ref.get(v)
            if a is None or b is None or np.asarray(a).dtype.kind != "f":
                continue
            a, b = np.asarray(a), np.asarray(b)
            if a.shape == b.shape and not np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
                return Divergence("fp64_reference", n.name or v, [f"{n.op_type} {n.name}"], _err(a, b))
    return None
