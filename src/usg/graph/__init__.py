"""Typed serving graphs: data model, YAML loader, Python builder, build-time validation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from usg.graph.builder import GraphBuilder
from usg.graph.catalog import exporter
from usg.graph.deploy import DeployPolicy, DeploySpec, parse_deploy
from usg.graph.limits import GraphLimits
from usg.graph.loader import parse_graph, read_graph_file
from usg.graph.model import BatchPolicy, Graph, InputDef, ModelDef, NodeDef, PadPolicy, Ref
from usg.graph.validate import describe_model, validate_graph

__all__ = [
    "BatchPolicy",
    "DeployPolicy",
    "DeploySpec",
    "Graph",
    "GraphBuilder",
    "GraphLimits",
    "InputDef",
    "ModelDef",
    "NodeDef",
    "PadPolicy",
    "Ref",
    "describe_model",
    "load_graph",
]


def load_graph(path: str | Path, *, export_missing: bool = False, log: Callable[[str], None] | None = None) -> Graph:
    """Read, validate and return the graph in a YAML file.

    With ``export_missing``, models whose file is missing but which declare an
    ``export:`` recipe are produced first (e.g. MiniLM exported to ONNX).
    Raises :class:`usg.errors.GraphError` listing every problem found.
    """
    p = Path(path).expanduser().resolve()
    data = read_graph_file(p)
    g = parse_graph(data, p.parent, str(p))
    deploy, deploy_problems = parse_deploy(data.get("deploy"), g.models, g.nodes)
    problems = g.problems + deploy_problems
    export = exporter()
    if export_missing and not problems and export is not None:
        export(g.models.values(), log)
    return validate_graph(
        g.name,
        g.inputs,
        g.models,
        g.nodes,
        g.outputs,
        source=p,
        limits=g.limits,
        problems=problems,
        deploy=deploy,
        cache=g.cache,
    )
