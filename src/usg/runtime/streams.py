"""What a stream carries from one chunk to the next: stateful models' states, fn nodes' own state.

A :class:`StreamState` belongs to one stream — a streaming session (:mod:`usg.stream`), or a
single request, which is a whole stream on its own. The executor reads and writes it:

- a stateful model's node (``state:`` on the model, :mod:`usg.graph.state`) takes its state
  inputs from ``models[NODE]`` (the declared init for a new stream) and stores the state
  outputs back, so the state of a stream never leaves it, while its items batch with other
  streams' items;
- a Python node whose function takes ``session_state`` gets a dict of its own that lives as
  long as the stream, ``ts_ms`` the capture time of the chunk being run, and ``flush`` True
  on the stream's last run (a session's close, or every single request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["STREAM_PARAMS", "StreamState"]

#: parameters the executor fills in for a Python node that declares them
STREAM_PARAMS = ("session_state", "ts_ms", "flush")


@dataclass
class StreamState:
    """The per-stream state, and the chunk being run (``ts_ms``, ``flush``)."""

    #: node → state input → array (batch axis of size 1)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: node → the dict a Python node keeps across chunks
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    ts_ms: float = 0.0
    flush: bool = True
    #: run a chunk's nodes one after the other (a session's chunk carries one input, so mostly one
    #: branch runs; no task per node), and skip input digests when no node cache needs them
    sequential: bool = False

    def node_params(self, node: str, names: set[str]) -> dict[str, Any]:
        """The stream parameters a Python node's function declares (``names``: its parameters)."""
        out: dict[str, Any] = {}
        if "session_state" in names:
            out["session_state"] = self.nodes.setdefault(node, {})
        if "ts_ms" in names:
            out["ts_ms"] = self.ts_ms
        if "flush" in names:
            out["flush"] = self.flush
        return out

    def nbytes(self) -> int:
        """Bytes held by the model states (numpy arrays) of this stream."""
        return sum(int(getattr(v, "nbytes", 0)) for ports in self.models.values() for v in ports.values())
