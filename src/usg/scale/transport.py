"""How a call crosses from the router to a replica: Ray's gRPC transport or the object store.

Ray Serve (>= 2.5x) can send a handle call over a direct gRPC channel between the two
processes (``handle.options(_by_reference=False)``) instead of as a Ray task whose large
arguments and results go through the object store. Measured on one machine
(``benchmarks/README.md``, "Engines"), gRPC is the cheaper hop for small payloads and far
the dearer one for large arrays (it pickles and frames every byte; the object store maps
them zero-copy). So each call picks: payloads up to ``grpc_max_bytes`` go by gRPC (pickle,
not cloudpickle: every type that crosses is importable on both sides), larger ones by
reference, where numpy arrays above Ray's 100 KiB inline limit are put in the object store
once and read zero-copy by the replica. The reply of a gRPC call comes back on gRPC, so the
replicas' gRPC message limit is raised to what the graph may answer
(:func:`grpc_env`).

Every call's bytes are counted by transport for ``/metrics``
(``usg_remote_bytes_total{target, direction, transport}``): ``object_store`` (a by-reference
payload above the inline limit), ``inline`` (a by-reference payload small enough to ride in
the task itself), ``grpc``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from usg.graph.model import Graph, NodeDef
from usg.ops.wire import wire_source

__all__ = [
    "GRPC_MAX_BYTES",
    "INLINE_MAX_BYTES",
    "Reducer",
    "Transport",
    "grpc_env",
    "output_reducers",
    "payload_bytes",
]

# Ray's max_direct_call_object_size: a task argument or result up to this size travels inline
INLINE_MAX_BYTES = 100 * 1024
# payloads up to this size take the gRPC hop (override: USG_RAY_GRPC_MAX_BYTES; 0 turns gRPC off)
GRPC_MAX_BYTES = int(os.environ.get("USG_RAY_GRPC_MAX_BYTES", str(2**20)))
# the replicas' (and the router's) gRPC receive limit: a reply to a small request can be large
_GRPC_MESSAGE_LIMIT = 512 * 2**20

BytesListener = Callable[[str, str, str, int], None]  # (target, direction, transport, bytes)


def payload_bytes(value: Any) -> int:
    """Bytes of the arrays, strings and bytes in a call's payload (dicts, lists, tuples walked),
    a :func:`usg.ops.wire.derived` array counted as its source."""
    if isinstance(value, np.ndarray):
        source = wire_source(value)
        if source is not None:  # it travels as what it is computed from
            return payload_bytes(source)
        return int(value.nbytes) if value.dtype != object else sum(payload_bytes(v) for v in value.flat)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):  # a BestPath, a ReplicaReply
        return sum(payload_bytes(getattr(value, f)) for f in value.__dataclass_fields__)
    return 8 if isinstance(value, (int, float, np.generic)) else 0


def grpc_env() -> dict[str, str]:
    """Environment for every USG deployment: the gRPC message limit raised past Ray's 4 MiB."""
    return {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(_GRPC_MESSAGE_LIMIT)}


def _grpc_handle(handle: Any) -> Any | None:
    """The handle over Ray Serve's gRPC transport, or None when this Ray has none."""
    if GRPC_MAX_BYTES <= 0 or not hasattr(handle, "options"):
        return None
    try:
        return handle.options(_by_reference=False, request_serialization="pickle", response_serialization="pickle")
    except (TypeError, ValueError):  # a Ray without the gRPC transport or these serializers
        return None


def _method(handle: Any, method: str | None) -> Any | None:
    if method is None:
        return handle
    if hasattr(handle, "options"):
        return handle.options(method_name=method)
    return getattr(handle, method, None)  # a stand-in for tests


class Transport:
    """The two handles of one deployment (or of one of its methods), and the choice per call.

    ``by_reference`` is None when the deployment has no such method (callers fall back)."""

    def __init__(self, target: str, handle: Any, method: str | None = None) -> None:
        self.target = target  # "model-det", for metrics
        self.by_reference = _method(handle, method)
        grpc = _grpc_handle(handle)
        self.grpc = None if grpc is None else _method(grpc, method)
        self.listeners: list[BytesListener] = []

    def pick(self, payload: Any) -> tuple[Any, str, int]:
        """The handle for this payload, its transport name and its size."""
        size = payload_bytes(payload)
        if self.grpc is not None and size <= GRPC_MAX_BYTES:
            return self.grpc, "grpc", size
        return self.by_reference, "object_store" if size > INLINE_MAX_BYTES else "inline", size

    def count(self, direction: str, transport: str, size: int) -> None:
        for listener in self.listeners:
            listener(self.target, direction, transport, size)

    def count_reply(self, transport: str, reply: Any) -> None:
        if not self.listeners:
            return
        size = payload_bytes(reply)
        if transport != "grpc":
            transport = "object_store" if size > INLINE_MAX_BYTES else "inline"
        self.count("reply", transport, size)


@dataclass(frozen=True)
class Reducer:
    """What a model's replica applies to one output before replying: ``fn(value, **options)``."""

    fn: str  # "module:function"
    options: Mapping[str, Any] = field(default_factory=dict)  # the reading node's options fn accepts


def _reducer_of(node: NodeDef, port: str) -> Reducer | None:
    from usg.callables import accepted_params, import_callable
    from usg.ops.signature import signature_of

    sig = signature_of(import_callable(node.fn)) if node.fn is not None else None
    ref = sig.reducers.get(port) if sig is not None else None
    if ref is None:
        return None
    names, var_kw = accepted_params(import_callable(ref))
    return Reducer(ref, {k: v for k, v in node.options.items() if var_kw or k in names})


def output_reducers(graph: Graph) -> dict[str, dict[str, Reducer]]:
    """Per model, output port -> the reducer its replicas apply before replying (:mod:`usg.ops.wire`).

    A model's output is reduced only when every node using the model sends that output only to
    Python nodes declaring the same reducer for the receiving port (``@op(reducers=...)``) with
    the same options for it (e.g. det_postprocess's ``box_thresh``), the output is not a graph
    output, and the node is not cached (the cache stores arrays).
    """
    consumers: dict[str, list[Reducer | None]] = {}  # "node.port" -> the reducer of each reader
    for node in graph.nodes.values():
        for port, ref in node.inputs.items():
            if not ref.is_graph_input:
                consumers.setdefault(f"{ref.source}.{ref.port}", []).append(_reducer_of(node, port))
    exported = {f"{r.source}.{r.port}" for r in graph.outputs.values() if not r.is_graph_input}
    out: dict[str, dict[str, Reducer]] = {}
    for model in graph.models:
        users = [n for n in graph.nodes.values() if n.model == model]
        plans: list[dict[str, Reducer]] = []
        for node in users:
            plan: dict[str, Reducer] = {}
            for key, found in consumers.items():
                source, _, port = key.partition(".")
                if source != node.name:
                    continue
                first = found[0]
                if first is not None and all(r == first for r in found) and key not in exported and node.cache is None:
                    plan[port] = first
            plans.append(plan)
        common = {p: r for p, r in plans[0].items() if all(pl.get(p) == r for pl in plans)} if plans else {}
        if common and all(set(pl) == set(common) for pl in plans):
            out[model] = common
    return out
