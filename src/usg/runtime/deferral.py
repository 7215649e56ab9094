"""Python-node outputs an executor only sends elsewhere: their derived arrays are not computed here.

A node function may return an array computed from a smaller source as
:func:`usg.ops.wire.derived` (det's float32 input from the uint8 page image), which travels to
another process as the function and its source. When every reader of such an output port is a
model whose backend computes it on the far side from its source (the Ray engine's router:
``Backend.ships_derived``; a Triton BLS call sends the tensor itself), the float32 array is never read in this
process: the executor calls the node inside :func:`usg.ops.wire.deferring`, so a ``derived``
that declares its shape and dtype returns a placeholder (the contract checks read its shape and
dtype; the remote side computes the values from the source). Placeholders in the node's other
ports — read here, sent back to the client, stored in a cache — are computed before anyone sees
them. Nothing is deferred for a cached node, or when an observer reads node values.

A placeholder is read-proof: reading its values (they would be zeros) raises
:class:`usg.errors.DeferredValueRead` naming the node and port (:mod:`usg.ops.wire`), and while an
executor defers anything, the inputs of its local model calls are checked for placeholders too
(readers that take the memory directly get past the Python hooks). An executor that defers
nothing — every graph on the embedded engine — makes no placeholders and pays for none of this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from usg.backends.base import Backend
from usg.graph.model import Graph, NodeDef
from usg.ops.wire import deferring, materialize, name_placeholders
from usg.runtime.request import call_fn

__all__ = ["call_deferring", "deferred_ports"]


def deferred_ports(graph: Graph, backends: Mapping[str, Backend], *, cached: bool) -> dict[str, frozenset[str]]:
    """Per Python node, its output ports read only by remote models (and not graph outputs).

    ``cached``: the executor runs a node cache (cached nodes store their outputs: never deferred)."""
    exported = {(r.source, r.port) for r in graph.outputs.values() if not r.is_graph_input}
    readers: dict[tuple[str, str], list[NodeDef]] = {}
    for node in graph.nodes.values():
        for ref in node.inputs.values():
            if not ref.is_graph_input:
                readers.setdefault((ref.source, ref.port), []).append(node)

    def remote(node: NodeDef) -> bool:
        backend = backends.get(node.model) if node.model is not None else None
        return backend is not None and backend.ships_derived

    out: dict[str, frozenset[str]] = {}
    for node in graph.nodes.values():
        if node.fn is None or (cached and node.cache is not None):
            continue
        ports = frozenset(
            port
            for (source, port), nodes in readers.items()
            if source == node.name and (source, port) not in exported and all(remote(n) for n in nodes)
        )
        if ports:
            out[node.name] = ports
    return out


def call_deferring(
    sent: frozenset[str], node: NodeDef, func: Callable[..., Any], kwargs: Mapping[str, Any], opts: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`usg.runtime.request.call_fn` inside :func:`usg.ops.wire.deferring`; placeholders in
    ports other than ``sent`` are computed."""
    with deferring(f"node {node.name!r}"):
        out = call_fn(node, func, kwargs, opts)
    for port, value in out.items():
        if port in sent:
            name_placeholders(value, f"node {node.name!r} port {port!r}")
        else:
            out[port] = materialize(value)
    return out
