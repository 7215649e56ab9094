"""Read a graph YAML file into the graph dataclasses, collecting every schema problem."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from usg.errors import GraphError, GraphProblem
from usg.graph.align import ALIGN_FN, parse_align
from usg.graph.cache import CacheSpec, parse_cache, resolve_node_cache
from usg.graph.keys import unknown_key
from usg.graph.limits import GraphLimits, parse_limits
from usg.graph.model import BatchPolicy, InputDef, ModelDef, NodeDef, PadPolicy, Ref
from usg.graph.state import parse_state
from usg.paths import PathResolutionError, resolve_path
from usg.specs import AudioSpec, Modality, TensorSpec
from usg.yaml_bounded import YAMLLimitError, load_bounded, read_bounded_text

__all__ = ["ParsedGraph", "parse_graph", "read_graph_file"]

_TOP_KEYS = {"name", "inputs", "models", "nodes", "outputs", "limits", "deploy", "description", "monitor", "cache"}
_TOP_KEYS.add("options")  # graph options: defaults of every fn node's options (parse_graph)
_INPUT_KEYS = {"modality", "dtype", "shape", "range", "layout", "optional", "description", "timestamped", "max_items"}
_AUDIO_KEYS = {"sample_rate", "channels", "max_seconds"}
_MODEL_KEYS = {"backend", "path", "options", "batch", "inputs", "export", "description", "state"}
_BATCH_KEYS = {
    "max_size",
    "max_delay_ms",
    "preferred_sizes",
    "pad",
    "max_tokens",
    "max_pixels",
    "max_queue",
    "max_pad_waste",
    "adaptive",
    "target_p95_ms",
}
_PAD_KEYS = {"axes", "multiple", "buckets", "value", "trim"}
_NODE_KEYS = {"model", "fn", "inputs", "map", "options", "description", "cache", "optional", "align"}
_ALIGN_NODE_KEYS = {"align", "description", "cache"}


class _Collector:
    def __init__(self) -> None:
        self.problems: list[GraphProblem] = []

    def add(self, where: str, message: str, fix: str) -> None:
        self.problems.append(GraphProblem(where, message, fix))

    def unknown_keys(self, where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
        for key in data:
            if key not in allowed:
                self.problems.append(unknown_key(where, key, allowed))


def read_graph_file(path: Path) -> dict[str, Any]:
    """Load the YAML mapping; malformed YAML becomes a GraphError with line and column.

    Read within :mod:`usg.yaml_bounded`'s bounds: a file past its size, an alias bomb, deep
    nesting, a repeated key or a huge integer is a problem with its fix, never a hang.
    """
    try:
        text = read_bounded_text(path)
    except FileNotFoundError:
        raise GraphError([GraphProblem(str(path), "graph file does not exist", "check the path you passed")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        fix = "pass a UTF-8 YAML file"
        if path.suffix.lower() == ".onnx":  # `usg run model.onnx`: the model itself instead of a graph for it
            fix = f"{path.name} is an ONNX model, not a graph: `usg init {path}` writes a runnable graph for it"
        raise GraphError([GraphProblem(str(path), f"cannot read graph file: {exc}", fix)], source=str(path)) from None
    except ValueError as exc:
        raise GraphError(
            [GraphProblem(str(path), f"graph {exc}", "pass the graph's YAML file (a few KiB), not a data file")]
        ) from None
    try:
        data = load_bounded(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        if isinstance(exc, YAMLLimitError):
            problem = GraphProblem(where, str(exc.problem), exc.fix)
        else:
            problem = GraphProblem(where, f"malformed YAML: {exc.problem or exc}", "fix the YAML syntax at that line")
        raise GraphError(
            [problem],
            source=str(path),
        ) from None
    except yaml.YAMLError as exc:
        raise GraphError([GraphProblem(str(path), f"malformed YAML: {exc}", "fix the YAML syntax")]) from None
    if not isinstance(data, dict):
        raise GraphError(
            [
                GraphProblem(
                    str(path),
                    f"top level is {type(data).__name__}, not a mapping",
                    "write a mapping with keys name, inputs, models, nodes, outputs",
                )
            ],
            source=str(path),
        )
    return data


def _spec(c: _Collector, where: str, data: Mapping[str, Any]) -> TensorSpec | None:
    if not any(k in data for k in ("dtype", "shape", "range", "layout")):
        return None
    try:
        return TensorSpec.from_dict(data)
    except (TypeError, ValueError, IndexError) as exc:
        c.add(
            where,
            f"invalid tensor spec {dict(data)}: {exc}",
            "dtype: a numpy dtype name; shape: a list; range: [lo, hi]",
        )
        return None


def _mapping(c: _Collector, where: str, value: Any, fix: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        c.add(where, f"expected a mapping, got {type(value).__name__} {value!r}", fix)
        return {}
    return value


def _ints(c: _Collector, where: str, value: Any, fix: str, *, low: int = 0) -> tuple[int, ...] | None:
    """A list of integers >= ``low`` (a single integer counts as a list of one), else a problem."""
    items = value if isinstance(value, list) else [value]
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items):
        return tuple(items)
    c.add(where, f"expected integers >= {low}, got {value!r}", fix)
    return None


def _pad_axes(c: _Collector, where: str, raw: Any) -> dict[str, tuple[int, ...]]:
    fix = "write axes: {INPUT_NAME: [AXIS, ...]} or axes: [AXIS, ...] with axis numbers such as 1"
    if isinstance(raw, dict):
        parsed = {str(k): _ints(c, f"{where}.{k}", v, fix, low=1) for k, v in raw.items()}
        return {k: v for k, v in parsed.items() if v is not None}
    if isinstance(raw, list):
        axes = _ints(c, where, raw, fix, low=1)
        return {"*": axes} if axes is not None else {}
    c.add(where, f"axes is {raw!r}", fix)
    return {}


def _pad_values(c: _Collector, where: str, raw: Any) -> dict[str, float]:
    items = raw.items() if isinstance(raw, dict) else [("*", raw)]
    out: dict[str, float] = {}
    for k, v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            out[str(k)] = float(v)
        else:
            c.add(where, f"pad value {v!r} is not a number", "write value: NUMBER or value: {INPUT: NUMBER}")
    return out


def _pad_trim(c: _Collector, where: str, raw: Any) -> dict[str, dict[int, tuple[str, int, int]]]:
    trim: dict[str, dict[int, tuple[str, int, int]]] = {}
    fix = "write trim: {OUTPUT: {OUTPUT_AXIS: 'INPUT:AXIS/DIVISOR'}}"
    for out_name, rules in _mapping(c, where, raw, fix).items():
        trim[str(out_name)] = {}
        for axis, rule in _mapping(c, f"{where}.{out_name}", rules, fix).items():
            # rule: "x:3/8" -> output axis follows input x axis 3, divided by 8
            try:
                src, _, rest = str(rule).partition(":")
                in_axis, _, div = rest.partition("/")
                trim[str(out_name)][int(axis)] = (src, int(in_axis), int(div or 1))
            except ValueError:
                c.add(f"{where}.{out_name}", f"trim rule {rule!r}", "write OUTPUT_AXIS: 'INPUT:AXIS/DIVISOR'")
    return trim


def _pad(c: _Collector, where: str, data: Any) -> PadPolicy | None:
    data = _mapping(c, where, data, "write pad: {axes: {INPUT: [AXIS]}, multiple: N}")
    if not data:
        return None
    c.unknown_keys(where, data, _PAD_KEYS)
    axes = _pad_axes(c, f"{where}.axes", data.get("axes"))
    buckets = _ints(c, f"{where}.buckets", data.get("buckets") or [], "write buckets: [SIZE, ...]", low=1) or ()
    multiple = data.get("multiple")
    if multiple is not None and (not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1):
        c.add(f"{where}.multiple", f"multiple is {multiple!r}", "use a positive integer such as 8 or 32")
        multiple = None
    return PadPolicy(
        axes=axes,
        multiple=multiple,
        buckets=tuple(sorted(buckets)),
        value=_pad_values(c, f"{where}.value", data.get("value", {})),
        trim=_pad_trim(c, f"{where}.trim", data.get("trim")),
    )


def _batch(c: _Collector, where: str, data: Any) -> BatchPolicy:
    data = _mapping(c, where, data, "write batch: {max_size: N, max_delay_ms: MS}")
    c.unknown_keys(where, data, _BATCH_KEYS)
    if not data:
        return BatchPolicy()

    def num(key: str, default: Any, kind: type) -> Any:
        value = data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            c.add(f"{where}.{key}", f"{key} is {value!r}", f"use a finite, non-negative {kind.__name__}")
            return default
        return kind(value)

    preferred = data.get("preferred_sizes") or []
    max_size = num("max_size", 1, int) or 1
    if not isinstance(preferred, list):
        c.add(
            f"{where}.preferred_sizes",
            f"preferred_sizes is {preferred!r}, not a list",
            f"write a list such as preferred_sizes: [{preferred!r}]",
        )
        preferred = []
    if any((not isinstance(p, int)) or isinstance(p, bool) or p < 1 or p > max_size for p in preferred):
        c.add(
            f"{where}.preferred_sizes",
            f"preferred_sizes {preferred} with max_size {max_size}",
            "use sizes between 1 and max_size",
        )
        preferred = []
    adaptive = data.get("adaptive")
    if adaptive is not None and not isinstance(adaptive, bool):
        c.add(f"{where}.adaptive", f"adaptive is {adaptive!r}", "write adaptive: true or adaptive: false")
        adaptive = None
    target = num("target_p95_ms", None, float)
    if target is not None and target <= 0:
        c.add(f"{where}.target_p95_ms", f"target_p95_ms is {target!r}", "use a positive number of milliseconds")
        target = None
    return BatchPolicy(
        max_size=max_size,
        max_delay_ms=num("max_delay_ms", 0.0, float),
        preferred_sizes=tuple(int(p) for p in preferred),
        pad=_pad(c, f"{where}.pad", data.get("pad")),
        max_tokens=num("max_tokens", None, int),
        max_pixels=num("max_pixels", None, int),
        max_queue=num("max_queue", 256, int),
        max_pad_waste=min(1.0, num("max_pad_waste", 0.35, float)),
        adaptive=adaptive,
        target_p95_ms=target,
    )


def _map_ports(c: _Collector, where: str, value: Any, ports: list[str]) -> tuple[str, ...]:
    if value in (None, False):
        return ()
    if value is True:
        return tuple(ports)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    c.add(where, f"map is {value!r}", "write map: true (all inputs), map: PORT, or map: [PORT, ...]")
    return ()


@dataclass
class ParsedGraph:
    """The parts of a graph file, before validation, and the schema problems found in it."""

    name: str
    inputs: dict[str, InputDef] = field(default_factory=dict)
    models: dict[str, ModelDef] = field(default_factory=dict)
    nodes: dict[str, NodeDef] = field(default_factory=dict)
    outputs: dict[str, Ref] = field(default_factory=dict)
    limits: GraphLimits = field(default_factory=GraphLimits)
    cache: CacheSpec | None = None
    problems: list[GraphProblem] = field(default_factory=list)


def _inputs(c: _Collector, data: Any) -> dict[str, InputDef]:
    inputs: dict[str, InputDef] = {}
    for iname, idata in _mapping(c, "inputs", data, "write inputs: {NAME: {modality: image}}").items():
        where = f"inputs.{iname}"
        idata = _mapping(c, where, idata, "write NAME: {modality: image|text|audio|tensor, optional: true}")
        c.unknown_keys(where, idata, _INPUT_KEYS | _AUDIO_KEYS if idata.get("modality") == "audio" else _INPUT_KEYS)
        raw_mod = idata.get("modality", "tensor")
        try:
            modality = Modality(raw_mod)
        except ValueError:
            c.add(f"{where}.modality", f"unknown modality {raw_mod!r}", "use image, text, audio or tensor")
            modality = Modality.TENSOR
        spec = _spec(c, where, idata)
        if spec is None and modality is Modality.IMAGE:
            spec = TensorSpec("uint8", ("H", "W", 3), layout="HWC")
        audio = _audio(c, where, idata) if modality is Modality.AUDIO else None
        stamped, max_items = idata.get("timestamped", False), idata.get("max_items", 256)
        if not isinstance(stamped, bool):
            c.add(f"{where}.timestamped", f"timestamped is {stamped!r}", "write timestamped: true or false")
            stamped = False
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            c.add(f"{where}.max_items", f"max_items is {max_items!r}", "write a positive integer, e.g. 256")
            max_items = 256
        optional = bool(idata.get("optional", False))
        inputs[str(iname)] = InputDef(str(iname), modality, spec, optional, audio, stamped, max_items)
    return inputs


def _audio(c: _Collector, where: str, idata: Mapping[str, Any]) -> AudioSpec:
    """``sample_rate`` / ``channels`` / ``max_seconds`` of an audio input: positive numbers."""
    base = AudioSpec()
    values: dict[str, Any] = {}
    for key, kind in (("sample_rate", int), ("channels", int), ("max_seconds", float)):
        raw = idata.get(key, getattr(base, key))
        bad = isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw <= 0
        if bad or (kind is int and raw != int(raw)):
            c.add(f"{where}.{key}", f"{key} is {raw!r}", f"write a positive {kind.__name__}, e.g. {getattr(base, key)}")
            raw = getattr(base, key)
        values[key] = kind(raw)
    return AudioSpec(**values)


def _model(c: _Collector, mname: str, mdata: Any, base_dir: Path | None) -> ModelDef:
    where = f"models.{mname}"
    mdata = _mapping(c, where, mdata, "write NAME: {backend: onnxruntime, path: FILE}")
    c.unknown_keys(where, mdata, _MODEL_KEYS)
    path = None
    if mdata.get("path") is not None:
        try:
            path = resolve_path(str(mdata["path"]), base_dir)
        except PathResolutionError as exc:
            c.add(f"{where}.path", str(exc), exc.fix)
    in_specs: dict[str, TensorSpec] = {}
    for pname, pdata in _mapping(
        c, f"{where}.inputs", mdata.get("inputs"), "write inputs: {INPUT: {range: [0, 1]}}"
    ).items():
        s = _spec(c, f"{where}.inputs.{pname}", pdata if isinstance(pdata, dict) else {})
        if s is not None:
            in_specs[str(pname)] = s
    export = mdata.get("export")
    state, state_problems = parse_state(f"{where}.state", mdata.get("state"))
    c.problems.extend(state_problems)
    return ModelDef(
        name=mname,
        backend=str(mdata.get("backend", "onnxruntime")),
        path=path,
        options=_mapping(c, f"{where}.options", mdata.get("options"), "write options: {KEY: VALUE}"),
        batch=_batch(c, f"{where}.batch", mdata.get("batch")),
        input_specs=in_specs,
        export=dict(export) if isinstance(export, dict) else None,
        state=state,
    )


def _align_node(c: _Collector, nname: str, ndata: dict[str, Any], cache: CacheSpec | None) -> NodeDef:
    where = f"nodes.{nname}"
    c.unknown_keys(where, ndata, _ALIGN_NODE_KEYS)
    spec, raw_refs, problems = parse_align(f"{where}.align", ndata["align"])
    c.problems.extend(problems)
    refs: dict[str, Ref] = {}
    for port, raw in raw_refs.items():
        try:
            refs[port] = Ref.parse(raw)
        except ValueError as exc:
            c.add(f"{where}.align.streams.{port}", str(exc), "write inputs.NAME or NODE.PORT")
    node_cache, cache_problems = resolve_node_cache(nname, ndata.get("cache"), cache)
    c.problems.extend(cache_problems)
    options = spec.options() if spec is not None else {}
    return NodeDef(name=nname, inputs=refs, fn=ALIGN_FN, options=options, cache=node_cache, align=spec)


def _node(c: _Collector, nname: str, ndata: Any, cache: CacheSpec | None = None) -> NodeDef:
    where = f"nodes.{nname}"
    ndata = _mapping(c, where, ndata, "write NAME: {model: MODEL | fn: module:function, inputs: {PORT: REF}}")
    if "align" in ndata:
        return _align_node(c, nname, ndata, cache)
    c.unknown_keys(where, ndata, _NODE_KEYS)
    refs: dict[str, Ref] = {}
    for port, raw in _mapping(
        c, f"{where}.inputs", ndata.get("inputs"), "write inputs: {PORT: inputs.NAME | NODE.PORT}"
    ).items():
        try:
            refs[str(port)] = Ref.parse(str(raw))
        except ValueError as exc:
            c.add(f"{where}.inputs.{port}", str(exc), "write inputs.NAME or NODE.PORT")
    model, fn = ndata.get("model"), ndata.get("fn")
    if (model is None) == (fn is None):
        c.add(
            where,
            "a node needs exactly one of 'model' or 'fn'",
            "write model: MODEL_NAME (from models:) or fn: package.module:function",
        )
    node_cache, cache_problems = resolve_node_cache(nname, ndata.get("cache"), cache)
    c.problems.extend(cache_problems)
    return NodeDef(
        name=nname,
        inputs=refs,
        model=None if model is None else str(model),
        fn=None if fn is None else str(fn),
        map=_map_ports(c, f"{where}.map", ndata.get("map"), list(refs)),
        options=_mapping(c, f"{where}.options", ndata.get("options"), "write options: {KEY: VALUE}"),
        cache=node_cache,
        optional=_optional_ports(c, where, ndata.get("optional"), list(refs), model is not None),
    )


def _optional_ports(c: _Collector, where: str, value: Any, ports: list[str], is_model: bool) -> tuple[str, ...]:
    if value in (None, False, []):
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(v, str) for v in names):
        c.add(f"{where}.optional", f"optional is {value!r}", "write optional: [PORT, ...]")
        return ()
    if is_model:
        c.add(f"{where}.optional", "a model node's inputs cannot be optional", "make the ports optional in a fn node")
        return ()
    for name in names:
        if name not in ports:
            c.add(f"{where}.optional", f"{name!r} is not one of its inputs", f"use one of: {', '.join(ports)}")
    return tuple(n for n in names if n in ports)


def _outputs(c: _Collector, data: Any) -> dict[str, Ref]:
    outputs: dict[str, Ref] = {}
    for oname, raw in _mapping(c, "outputs", data, "write outputs: {NAME: NODE.PORT}").items():
        try:
            outputs[str(oname)] = Ref.parse(str(raw))
        except ValueError as exc:
            c.add(f"outputs.{oname}", str(exc), "write NODE.PORT")
    if not outputs:
        c.add("outputs", "the graph declares no outputs", "add outputs: {NAME: NODE.PORT}")
    return outputs


def parse_graph(data: Mapping[str, Any], base_dir: Path | None, source: str | None = None) -> ParsedGraph:
    """Turn a graph mapping into dataclasses: the parts and the schema problems found."""
    c = _Collector()
    c.unknown_keys("graph", data, _TOP_KEYS)
    parsed = ParsedGraph(str(data.get("name") or (Path(source).stem if source else "graph")))
    parsed.inputs = _inputs(c, data.get("inputs"))
    models = _mapping(c, "models", data.get("models"), "write models: {NAME: {backend: ..., path: ...}}")
    parsed.models = {str(m): _model(c, str(m), d, base_dir) for m, d in models.items()}
    nodes = _mapping(c, "nodes", data.get("nodes"), "write nodes: {NAME: {model: M, inputs: {...}}}")
    parsed.cache, cache_problems = parse_cache(data.get("cache"))
    c.problems.extend(cache_problems)
    parsed.nodes = {str(n): _node(c, str(n), d, parsed.cache) for n, d in nodes.items()}
    shared = _mapping(c, "options", data.get("options"), "write options: {KEY: VALUE} (e.g. vlm: true)")
    if shared:  # graph options: defaults of every fn node's options (a node's own value wins)
        parsed.nodes = {
            n: dataclasses.replace(d, options={**shared, **d.options}) if d.fn is not None else d
            for n, d in parsed.nodes.items()
        }
    parsed.outputs = _outputs(c, data.get("outputs"))
    parsed.limits, limit_problems = parse_limits(data.get("limits"))
    parsed.problems = c.problems + limit_problems
    return parsed
