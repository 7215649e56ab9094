"""One request in flight, and the small pieces of running its nodes that both the executor's
request path and a stream's chunk path (:mod:`usg.runtime.chunks`) use."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from usg.cache.node_cache import CacheBegin
from usg.errors import BackendError, USGError
from usg.graph.model import OUT_ALIAS, Graph, NodeDef, Ref, model_output
from usg.runtime.events import EventSink, TokenCallback, TokenDelta
from usg.runtime.streams import StreamState

__all__ = ["EmptyFanOut", "Request", "aliased", "call_fn", "missing_graph_output", "missing_output", "plan_request"]


@dataclass
class Request:
    """One request in flight: its inputs, each node's task, and the outputs and times of the
    nodes that ran (``None``: the node was skipped at run time)."""

    rid: str
    values: dict[str, Any]
    stream: StreamState
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    node_ms: dict[str, float] = field(default_factory=dict)
    cache: CacheBegin | None = None
    emit: EventSink | None = None  # a streaming caller's sink (see usg.runtime.events)

    def token_callback(self, node: str) -> TokenCallback | None:
        """What an LLM node calls with each token delta, when the caller streams."""
        emit = self.emit
        if emit is None:
            return None
        return lambda text: emit(TokenDelta(node, text))

    def node_args(self, node: NodeDef) -> dict[str, Any] | None:
        """The node's inputs by port, or None when one is absent (its branch is skipped)."""
        args: dict[str, Any] = {}
        for port, ref in node.inputs.items():
            if port in node.optional and self._absent(ref):
                continue  # the node runs without it
            if ref.is_graph_input:
                args[port] = self.values[ref.port]
                continue
            up = self.outputs.get(ref.source)
            if up is None:  # upstream skipped at run time
                return None
            if ref.port not in up:
                raise missing_output(ref.source, ref.port, up, node.name)
            args[port] = up[ref.port]
        return None if any(v is None for v in args.values()) else args

    def _absent(self, ref: Ref) -> bool:
        if ref.is_graph_input:
            return self.values.get(ref.port) is None
        up = self.outputs.get(ref.source)
        return up is None or up.get(ref.port) is None

    def graph_outputs(self, graph: Graph) -> dict[str, Any]:
        """The graph's outputs that have a value: absent ones (a pruned branch, a None value) are left
        out, but a node that ran and did not return the port an output reads is an error."""
        result: dict[str, Any] = {}
        for oname, ref in graph.outputs.items():
            if ref.is_graph_input:
                if ref.port in self.values:
                    result[oname] = self.values[ref.port]
                continue
            up = self.outputs.get(ref.source)
            if up is None:
                continue
            if ref.port not in up:
                raise missing_graph_output(ref.source, ref.port, up, oname)
            if up[ref.port] is not None:
                result[oname] = up[ref.port]
        return result


def missing_output(source: str, port: str, up: Mapping[str, Any], node: str) -> BackendError:
    """The error of a node that did not return an output another node is wired to."""
    return BackendError(
        f"node {source!r} returned no output {port!r} (it returned {sorted(up)}), which node {node!r} "
        f"needs; fix: return {port!r} from it"
    )


def missing_graph_output(source: str, port: str, up: Mapping[str, Any], output: str) -> BackendError:
    """The error of a node that ran and did not return the port a graph output reads (absent
    outputs are only those of pruned branches and None values)."""
    return BackendError(
        f"node {source!r} returned no output {port!r} (it returned {sorted(map(str, up))}), "
        f"which graph output {output!r} reads; fix: return {port!r} from it (None for no value)"
    )


def aliased(out: dict[str, Any], out_names: list[str]) -> dict[str, Any]:
    """A single-output model's outputs with the ``out`` alias added (:func:`model_output`)."""
    if len(out_names) != 1 or OUT_ALIAS in out:
        return out
    real = model_output(OUT_ALIAS, out_names)
    return {**out, OUT_ALIAS: out[real]} if real in out else out


def call_fn(
    node: NodeDef, func: Callable[..., Any], kwargs: Mapping[str, Any], opts: Mapping[str, Any]
) -> dict[str, Any]:
    """Call a Python node's function: an exception it raises (other than a USGError) becomes a
    BackendError naming the node, and so does a result that is not a dict."""
    try:
        out = func(**kwargs, **opts)
    except USGError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in a node: its error, not the server's end
        raise BackendError(f"node {node.name!r} (fn {node.fn}) raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, dict):
        raise BackendError(
            f"node {node.name!r} (fn {node.fn}) returned {type(out).__name__}; "
            "fix: return a dict of output port -> value"
        )
    return out


class EmptyFanOut(dict[str, Any]):
    """Outputs of a map node that ran over an empty list: every port is an empty list."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> list[Any]:
        return []


def plan_request(graph: Graph, present: set[str]) -> tuple[list[str], list[str]]:
    """Nodes that run for a set of present graph inputs, and nodes pruned (in graph order)."""
    active: list[str] = []
    alive: set[str] = set()
    for name in graph.order:
        node = graph.nodes[name]
        ok = all(
            (r.port in present) if r.is_graph_input else (r.source in alive)
            for p, r in node.inputs.items()
            if p not in node.optional
        )
        if ok:
            alive.add(name)
            active.append(name)
    return active, [n for n in graph.order if n not in alive]
