"""The inverse of the loader: a :class:`Graph` as the mapping its YAML file would hold.

``load_graph(write(graph_to_mapping(g)))`` builds a graph equal to ``g`` (the round trip is
tested), so tools that write a graph for another runtime (the Triton BLS model's copy) keep
every field the data model has, and fail loudly here when a new field is not dumped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from usg.graph.cache import CacheSpec
from usg.graph.deploy import DeployPolicy, DeploySpec
from usg.graph.model import BatchPolicy, Graph, ModelDef, PadPolicy

__all__ = ["graph_to_mapping"]


def _pad(pad: PadPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {"axes": {k: list(v) for k, v in pad.axes.items()}}
    if pad.multiple is not None:
        out["multiple"] = pad.multiple
    if pad.buckets:
        out["buckets"] = list(pad.buckets)
    if pad.value:
        out["value"] = dict(pad.value)
    if pad.trim:
        out["trim"] = {
            name: {axis: f"{src}:{in_axis}/{div}" for axis, (src, in_axis, div) in rules.items()}
            for name, rules in pad.trim.items()
        }
    return out


def _batch(batch: BatchPolicy) -> dict[str, Any]:
    default = BatchPolicy()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(BatchPolicy):
        value = getattr(batch, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name == "pad":
            out["pad"] = _pad(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def _model(m: ModelDef, path: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": m.backend}
    if path is not None:
        out["path"] = path
    if m.options:
        out["options"] = dict(m.options)
    batch = _batch(m.batch)
    if batch:
        out["batch"] = batch
    if m.input_specs:
        out["inputs"] = {p: s.to_dict() for p, s in m.input_specs.items()}
    if m.export is not None:
        out["export"] = dict(m.export)
    return out


def _policy(p: DeployPolicy) -> dict[str, Any]:
    default = DeployPolicy()
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if getattr(p, f.name) != getattr(default, f.name)}


def _deploy(d: DeploySpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if d.router != DeployPolicy():
        out["router"] = _policy(d.router)
    if d.models:
        out["models"] = {n: _policy(p) for n, p in d.models.items()}
    if d.nodes:
        out["nodes"] = {n: _policy(p) for n, p in d.nodes.items()}
    return out


def _cache(spec: CacheSpec, *, graph_level: bool) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}
    out.pop("hmac_key_where")  # where the field was written, not a setting
    if not graph_level:
        out.pop("default")
    return out


def graph_to_mapping(graph: Graph, *, model_paths: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The graph's YAML mapping; ``model_paths`` replaces the paths of the named models
    (other paths are written absolute, as the loader resolved them)."""
    paths = dict(model_paths or {})
    inputs: dict[str, Any] = {}
    for name, d in graph.inputs.items():
        entry: dict[str, Any] = {"modality": d.modality.value}
        if d.spec is not None:
            entry.update(d.spec.to_dict())
        if d.optional:
            entry["optional"] = True
        if d.audio is not None:
            entry.update(sample_rate=d.audio.sample_rate, channels=d.audio.channels, max_seconds=d.audio.max_seconds)
        if d.timestamped:
            entry.update(timestamped=True, max_items=d.max_items)
        inputs[name] = entry
    models = {
        name: _model(m, paths.get(name) or (str(m.path) if m.path is not None else None))
        for name, m in graph.models.items()
    }
    nodes: dict[str, Any] = {}
    for name in graph.nodes:  # declaration order: the loader derives the same topological order
        n = graph.nodes[name]
        if n.align is not None:
            nodes[name] = {"align": n.align.to_mapping(n.inputs)}
            if n.cache is not None:
                nodes[name]["cache"] = _cache(n.cache, graph_level=False)
            continue
        node: dict[str, Any] = {"model": n.model} if n.model is not None else {"fn": n.fn}
        node["inputs"] = {p: str(r) for p, r in n.inputs.items()}
        if n.map:
            node["map"] = list(n.map)
        if n.optional:
            node["optional"] = list(n.optional)
        if n.options:
            node["options"] = dict(n.options)
        if n.cache is not None:
            node["cache"] = _cache(n.cache, graph_level=False)
        elif graph.cache is not None and graph.cache.default:
            node["cache"] = False
        nodes[name] = node
    doc: dict[str, Any] = {"name": graph.name, "inputs": inputs, "models": models, "nodes": nodes}
    doc["outputs"] = {o: str(r) for o, r in graph.outputs.items()}
    if graph.limits.declared():
        doc["limits"] = graph.limits.declared()
    if graph.cache is not None:
        doc["cache"] = _cache(graph.cache, graph_level=True)
    deploy = _deploy(graph.deploy)
    if deploy:
        doc["deploy"] = deploy
    return doc
