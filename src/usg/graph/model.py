"""The graph's data model: plain frozen dataclasses shared by the YAML loader and the Python builder."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.graph.align import AlignSpec
from usg.graph.cache import CacheSpec
from usg.graph.deploy import DeploySpec
from usg.graph.limits import GraphLimits
from usg.graph.state import StateSpec
from usg.specs import AudioSpec, Modality, TensorSpec

__all__ = [
    "OUT_ALIAS",
    "BatchPolicy",
    "Graph",
    "InputDef",
    "ModelDef",
    "NodeDef",
    "PadPolicy",
    "Ref",
    "model_output",
    "wireable_outputs",
]

GRAPH_INPUTS = "inputs"
#: the port name that stands for the only output of a single-output model
OUT_ALIAS = "out"


def model_output(port: str, outputs: Iterable[str]) -> str:
    """The model output a wire's ``port`` names: ``out`` is the alias of a single-output
    model's one output (the rule the executor, validation, ``/v2`` and the Triton export share)."""
    if port != OUT_ALIAS:
        return port
    names = list(outputs)
    return names[0] if len(names) == 1 else port


def wireable_outputs(outputs: Iterable[str]) -> list[str]:
    """The ports a wire may name on a model with these outputs (its outputs, and ``out`` for one)."""
    names = list(outputs)
    return [*names, OUT_ALIAS] if len(names) == 1 and names[0] != OUT_ALIAS else names


@dataclass(frozen=True)
class Ref:
    """A wire end: ``inputs.NAME`` (a graph input) or ``NODE.PORT`` (a node output)."""

    source: str
    port: str

    @property
    def is_graph_input(self) -> bool:
        return self.source == GRAPH_INPUTS

    @classmethod
    def parse(cls, text: str) -> Ref:
        source, sep, port = str(text).partition(".")
        if not sep or not source or not port:
            raise ValueError(f"{text!r} is not a reference; write 'inputs.NAME' or 'NODE.PORT'")
        return cls(source, port)

    def __str__(self) -> str:
        return f"{self.source}.{self.port}"


@dataclass(frozen=True)
class InputDef:
    name: str
    modality: Modality
    spec: TensorSpec | None = None
    optional: bool = False
    audio: AudioSpec | None = None  # modality audio: rate, channels, length limit (defaults when None)
    # a list of items with capture times, [{VALUE, ts_ms}, ...] (e.g. frames for an align node),
    # at most max_items of them; nodes get [{"image"|"audio"|"text"|"value": ..., "ts_ms": float}, ...]
    timestamped: bool = False
    max_items: int = 256


@dataclass(frozen=True)
class PadPolicy:
    """Which axes of a model's inputs may be padded to batch unequal items, and how.

    ``axes`` are per input name (``{"x": [3]}``); ``multiple`` rounds a padded size up to a
    multiple, ``buckets`` to the next listed size. ``value`` is the pad value per input
    (default 0). Only models declared pad-safe get a PadPolicy.
    """

    axes: dict[str, tuple[int, ...]]
    multiple: int | None = None
    buckets: tuple[int, ...] = ()
    value: dict[str, float] = field(default_factory=dict)
    # output axes that follow a padded input axis and must be cut back per item,
    # e.g. {"out": {1: ("x", 3, 8)}}: output axis 1 has size x.axis3 / 8 (None: no cut)
    trim: dict[str, dict[int, tuple[str, int, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchPolicy:
    max_size: int = 1
    max_delay_ms: float = 0.0
    preferred_sizes: tuple[int, ...] = ()
    pad: PadPolicy | None = None
    max_tokens: int | None = None
    max_pixels: int | None = None
    max_queue: int = 256
    # with padding: stop growing a batch when more than this fraction of its padded elements
    # would be padding (on CPU, compute follows padded tokens; tight batches beat big ones)
    max_pad_waste: float = 0.35
    # dynamic batch controller (usg.runtime.controller): cap and wait adapt to measured per-item
    # cost, bounded by max_size / max_delay_ms; p95 (queue + call) kept under target_p95_ms.
    # None (not written): on when the model's calls report their CPU time (single-threaded CPU
    # ONNX Runtime sessions) or target_p95_ms is declared; true / false force it
    adaptive: bool | None = None
    target_p95_ms: float | None = None

    @property
    def enabled(self) -> bool:
        return self.max_size > 1


@dataclass(frozen=True)
class ModelDef:
    """A loaded-once model (one session, one batcher) that one or more nodes call."""

    name: str
    backend: str
    path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    batch: BatchPolicy = BatchPolicy()
    # declared contracts that tighten what the model file says (e.g. a value range)
    input_specs: dict[str, TensorSpec] = field(default_factory=dict)
    # how to produce the file when it is missing (e.g. {"exporter": "hf-text-encoder", ...})
    export: dict[str, Any] | None = None
    # a stateful model: state inputs fed back from outputs, per stream (usg.graph.state)
    state: StateSpec | None = None

    @property
    def concurrency(self) -> int:
        """``options.concurrency``: backend calls (batches) in flight at once (validated at build)."""
        return max(1, int(self.options.get("concurrency", 1)))

    @property
    def call_timeout_s(self) -> float | None:
        """``options.call_timeout_ms`` in seconds: the deadline of one backend call (None: none)."""
        ms = self.options.get("call_timeout_ms")
        return None if ms is None else float(ms) / 1e3


@dataclass(frozen=True)
class NodeDef:
    """A step: a call of a model, or of a Python function ``module:function``."""

    name: str
    inputs: dict[str, Ref]
    model: str | None = None
    fn: str | None = None
    map: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    # where the node's results are cached (None: not cached); see usg.graph.cache
    cache: CacheSpec | None = None
    # input ports that may be absent (their graph input not sent, their source pruned or empty):
    # the node runs without them (fn nodes only; the function's default applies)
    optional: tuple[str, ...] = ()
    # an ``align:`` node (a timestamp-aligned join; its fn is usg.runtime.align_node:align_streams)
    align: AlignSpec | None = None

    @property
    def kind(self) -> str:
        if self.align is not None:
            return "align"
        return "model" if self.model is not None else "fn"


@dataclass(frozen=True)
class Graph:
    """A validated graph. Build one with :func:`usg.graph.load_graph` or :class:`usg.graph.GraphBuilder`."""

    name: str
    inputs: dict[str, InputDef]
    models: dict[str, ModelDef]
    nodes: dict[str, NodeDef]
    outputs: dict[str, Ref]
    source: Path | None = None
    order: tuple[str, ...] = ()  # node names in a topological order
    limits: GraphLimits = field(default_factory=GraphLimits)
    # replicas / autoscaling / resources for the scale-out engines (Ray Serve, Triton export)
    deploy: DeploySpec = field(default_factory=DeploySpec)
    # the graph-level ``cache:`` section (None: absent); nodes carry their resolved spec
    cache: CacheSpec | None = None

    def upstream(self, node: str) -> set[str]:
        return {r.source for r in self.nodes[node].inputs.values() if not r.is_graph_input}

    def without_cache(self) -> Graph:
        """The same graph with every node cache off (``usg serve --no-cache``; benchmarks and tests
        that count model calls)."""
        nodes = {name: dataclasses.replace(node, cache=None) for name, node in self.nodes.items()}
        return dataclasses.replace(self, nodes=nodes, cache=None)

    def consumers(self, node: str) -> list[str]:
        return [n for n, d in self.nodes.items() if any(r.source == node for r in d.inputs.values())]
