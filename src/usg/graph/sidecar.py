"""The ``usg tune`` sidecar: ``GRAPH.tuned.yaml`` beside a graph file, merged into the loaded graph.

``usg tune`` (:mod:`usg.bench.tune`) writes it with the batch sizes and thread counts it measured
on this machine; ``usg run / serve / bench`` load the graph through :func:`apply_sidecar`. It is
machine-specific, so git ignores it; delete it to go back to the graph as written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from usg.errors import GraphError, GraphProblem
from usg.graph.model import BatchPolicy, Graph

__all__ = [
    "QUANT_SIDECAR_VERSION",
    "SIDECAR_VERSION",
    "apply_quant_sidecar",
    "apply_sidecar",
    "quant_sidecar_path",
    "read_sidecar",
    "sidecar_path",
]

SIDECAR_VERSION = 1
QUANT_SIDECAR_VERSION = 1


def sidecar_path(graph_path: str | Path) -> Path:
    p = Path(graph_path)
    return p.with_name(p.stem + ".tuned.yaml")


def quant_sidecar_path(graph_path: str | Path) -> Path:
    p = Path(graph_path)
    return p.with_name(p.stem + ".quant.yaml")


def read_sidecar(path: Path, kind: str = "usg_tune") -> dict[str, Any]:
    import yaml

    from usg.yaml_bounded import load_bounded, read_bounded_text

    command = "usg tune" if kind == "usg_tune" else "usg quantize"
    version = SIDECAR_VERSION if kind == "usg_tune" else QUANT_SIDECAR_VERSION
    try:
        doc = load_bounded(read_bounded_text(path)) or {}
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise GraphError(
            [
                GraphProblem(
                    where,
                    f"cannot read this {command} sidecar: {getattr(exc, 'problem', None) or exc}",
                    f"delete it and run `{command} GRAPH` again" + ("" if kind == "usg_tune" else " (or pass --fp32)"),
                )
            ]
        ) from None
    if not isinstance(doc, dict) or doc.get(kind) != version:
        raise GraphError(
            [
                GraphProblem(
                    str(path),
                    f"not a {command} sidecar (version {version})",
                    f"delete it and run `{command} GRAPH` again",
                )
            ]
        )
    return doc


_BATCH_FIELDS = {"max_size", "max_delay_ms", "preferred_sizes", "max_tokens", "max_pixels", "max_queue"}


def apply_sidecar(graph: Graph, path: Path | None = None) -> Graph:
    """The graph with the sidecar's per-model options and batch fields merged in (a new Graph;
    the input is unchanged). Without a sidecar next to the graph file, the graph itself."""
    if path is None:
        if graph.source is None:
            return graph
        path = sidecar_path(graph.source)
    if not path.is_file():
        return graph
    doc = read_sidecar(path)
    problems: list[GraphProblem] = []
    models = dict(graph.models)
    for name, entry in (doc.get("models") or {}).items():
        where = f"{path.name}: models.{name}"
        if name not in models:
            problems.append(
                GraphProblem(
                    where,
                    f"the graph has no model {name!r}",
                    f"run `usg tune {graph.source}` again, or delete {path.name}",
                )
            )
            continue
        model = models[name]
        batch_in = dict(entry.get("batch") or {})
        unknown = sorted(set(batch_in) - _BATCH_FIELDS)
        if unknown:
            problems.append(GraphProblem(where, f"unknown batch fields {unknown}", f"use only {sorted(_BATCH_FIELDS)}"))
            continue
        if "preferred_sizes" in batch_in:
            batch_in["preferred_sizes"] = tuple(int(s) for s in batch_in["preferred_sizes"])
        batch: BatchPolicy = dataclasses.replace(model.batch, **batch_in)
        options = {**model.options, **(entry.get("options") or {})}
        models[name] = dataclasses.replace(model, options=options, batch=batch)
    if problems:
        raise GraphError(problems)
    return dataclasses.replace(graph, models=models)


def apply_quant_sidecar(graph: Graph, path: Path | None = None) -> Graph:
    """The graph with the quantized model files ``usg quantize`` chose (``GRAPH.quant.yaml``; paths
    relative to it) in place of the FP32 ones. A sidecar whose FP32 source file changed size since
    it was written is refused. Without a sidecar next to the graph file, the graph itself."""
    if path is None:
        if graph.source is None:
            return graph
        path = quant_sidecar_path(graph.source)
    if not path.is_file():
        return graph
    doc = read_sidecar(path, "usg_quant")
    problems: list[GraphProblem] = []
    models = dict(graph.models)
    redo = f"run `usg quantize {graph.source or 'GRAPH'}` again, or delete {path.name} (or pass --fp32)"
    for name, entry in (doc.get("models") or {}).items():
        model = models.get(name)
        quantized = path.parent / str(entry.get("path", ""))
        if model is None or model.path is None:
            problems.append(GraphProblem(f"{path.name}: models.{name}", f"the graph has no ONNX model {name!r}", redo))
        elif model.path.is_file() and model.path.stat().st_size != entry.get("source_bytes"):
            problems.append(
                GraphProblem(f"{path.name}: models.{name}", f"{model.path} changed since it was quantized", redo)
            )
        elif not quantized.is_file():
            problems.append(GraphProblem(f"{path.name}: models.{name}.path", f"{quantized} does not exist", redo))
        else:
            models[name] = dataclasses.replace(model, path=quantized)
    if problems:
        raise GraphError(problems)
    return dataclasses.replace(graph, models=models)
