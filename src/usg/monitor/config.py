"""The graph's ``monitor:`` section: what to watch, windows, thresholds, health weights.

Read from the raw YAML mapping of the graph file (the graph loader only accepts the key)::

    monitor:
      window: {size: 200, step: 200}        # count window; or {seconds: 60, step: 30}
      sample: 1.0                           # fraction of requests observed
      outputs:                              # node outputs (NODE.PORT) or graph output names
        text_embedding: {kind: embedding}
        scores: {ref: lines.scores, kind: score, bins: 20, range: [0, 1]}
      thresholds: {p_value: 0.01, psi: 0.2, kl: 0.05, cosine: 0.02, permutations: 499}
      health: {weights: {error_rate: 0.3}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from usg.errors import GraphError, GraphProblem
from usg.graph.model import Graph, Ref

__all__ = [
    "DEFAULT_WEIGHTS",
    "MonitorConfig",
    "OutputWatch",
    "Thresholds",
    "WindowSpec",
    "monitor_config",
    "parse_monitor",
]

DEFAULT_WEIGHTS: dict[str, float] = {
    "latency_jitter": 0.15,
    "modality_missing": 0.10,
    "cache_hit_ratio": 0.10,
    "error_rate": 0.30,
    "rejection_rate": 0.15,
    "queue_saturation": 0.20,
}
_KEYS = {"window", "sample", "outputs", "thresholds", "health", "reference_size"}
_WINDOW_KEYS = {"size", "seconds", "step"}
_OUTPUT_KEYS = {"ref", "kind", "bins", "range"}
_THRESHOLD_KEYS = {"p_value", "psi", "kl", "cosine", "permutations"}
_KINDS = ("embedding", "score")


@dataclass(frozen=True)
class WindowSpec:
    """A count window (last ``size`` requests) or a time window (last ``seconds``), evaluated every ``step``
    requests or seconds (default: the window's length, i.e. tumbling windows)."""

    size: int | None = 200
    seconds: float | None = None
    step: float | None = None

    @property
    def every(self) -> float:
        if self.step is not None:
            return self.step
        return float(self.seconds if self.seconds is not None else self.size or 200)

    def describe(self) -> str:
        if self.seconds is not None:
            return f"last {self.seconds:g} s, every {self.every:g} s"
        return f"last {self.size} requests, every {self.every:g}"


@dataclass(frozen=True)
class OutputWatch:
    """A node output whose distribution is profiled: an embedding (vectors) or a score (numbers)."""

    name: str
    ref: Ref
    kind: str = "embedding"
    bins: int = 20
    range: tuple[float, float] | None = None


@dataclass(frozen=True)
class Thresholds:
    """``p_value``: level of each test family (Bonferroni inside it); ``psi``, ``kl``: the smallest
    effect that counts for input features and score outputs; ``cosine``: centroid shift shown as a warning;
    ``permutations``: resamples of the MMD permutation test."""

    p_value: float = 0.01
    psi: float = 0.2
    kl: float = 0.05
    cosine: float = 0.02
    permutations: int = 499

    def to_dict(self) -> dict[str, float]:
        return {
            "p_value": self.p_value,
            "psi": self.psi,
            "kl": self.kl,
            "cosine": self.cosine,
            "permutations": self.permutations,
        }


@dataclass(frozen=True)
class MonitorConfig:
    window: WindowSpec = field(default_factory=WindowSpec)
    outputs: tuple[OutputWatch, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    sample: float = 1.0
    reference_size: int = 1000


def _num(problems: list[GraphProblem], where: str, value: Any, *, positive: bool = True) -> float | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        problems.append(
            GraphProblem(where, f"{where.rsplit('.', 1)[-1]} is {value!r}", "use a finite, positive number")
        )
        return None
    return float(value)


def _unknown(problems: list[GraphProblem], where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            problems.append(
                GraphProblem(f"{where}.{key}", f"unknown key {key!r}", f"remove it, or use one of: {sorted(allowed)}")
            )


def _window(problems: list[GraphProblem], data: Any) -> WindowSpec:
    if data is None:
        return WindowSpec()
    if not isinstance(data, dict):
        problems.append(GraphProblem("monitor.window", f"window is {data!r}", "write window: {size: 200}"))
        return WindowSpec()
    _unknown(problems, "monitor.window", data, _WINDOW_KEYS)
    if "size" in data and "seconds" in data:
        problems.append(
            GraphProblem("monitor.window", "both size and seconds given", "use size (requests) or seconds, not both")
        )
    step = _num(problems, "monitor.window.step", data["step"]) if "step" in data else None
    if "seconds" in data:
        return WindowSpec(size=None, seconds=_num(problems, "monitor.window.seconds", data["seconds"]), step=step)
    size = _num(problems, "monitor.window.size", data.get("size", 200))
    if size is not None and size < 20:
        problems.append(GraphProblem("monitor.window.size", f"size is {size:g}", "use at least 20 requests"))
    return WindowSpec(size=int(size or 200), step=step)


def _outputs(problems: list[GraphProblem], data: Any, graph: Graph) -> tuple[OutputWatch, ...]:
    if data is None:
        return ()
    if not isinstance(data, dict):
        problems.append(GraphProblem("monitor.outputs", f"outputs is {data!r}", "write outputs: {NAME: {kind: ...}}"))
        return ()
    watches = []
    for name, spec in data.items():
        where = f"monitor.outputs.{name}"
        spec = spec if isinstance(spec, dict) else {}
        _unknown(problems, where, spec, _OUTPUT_KEYS)
        raw_ref = spec.get("ref", name)
        if "." in str(raw_ref):
            ref = Ref.parse(str(raw_ref))
        elif str(raw_ref) in graph.outputs:
            ref = graph.outputs[str(raw_ref)]
        else:
            problems.append(
                GraphProblem(
                    where,
                    f"{raw_ref!r} is neither a graph output nor NODE.PORT",
                    f"use a graph output ({', '.join(sorted(graph.outputs))}) or write ref: NODE.PORT",
                )
            )
            continue
        if not ref.is_graph_input and ref.source not in graph.nodes:
            problems.append(
                GraphProblem(where, f"node {ref.source!r} does not exist", f"use one of {sorted(graph.nodes)}")
            )
            continue
        kind = str(spec.get("kind", "embedding"))
        if kind not in _KINDS:
            problems.append(GraphProblem(f"{where}.kind", f"kind is {kind!r}", "use embedding or score"))
            continue
        rng = spec.get("range")
        if rng is not None and not (isinstance(rng, list) and len(rng) == 2 and float(rng[0]) < float(rng[1])):
            problems.append(GraphProblem(f"{where}.range", f"range is {rng!r}", "write range: [LOW, HIGH]"))
            rng = None
        bins = spec.get("bins", 20)
        if not isinstance(bins, int) or bins < 2:
            problems.append(GraphProblem(f"{where}.bins", f"bins is {bins!r}", "use an integer of at least 2"))
            bins = 20
        watches.append(OutputWatch(str(name), ref, kind, bins, None if rng is None else (float(rng[0]), float(rng[1]))))
    return tuple(watches)


def _thresholds(problems: list[GraphProblem], data: Any) -> Thresholds:
    if data is None:
        return Thresholds()
    if not isinstance(data, dict):
        problems.append(GraphProblem("monitor.thresholds", f"thresholds is {data!r}", "write thresholds: {psi: 0.1}"))
        return Thresholds()
    _unknown(problems, "monitor.thresholds", data, _THRESHOLD_KEYS)
    values: dict[str, Any] = {}
    for key in _THRESHOLD_KEYS & set(data):
        v = _num(problems, f"monitor.thresholds.{key}", data[key])
        if v is not None:
            values[key] = int(v) if key == "permutations" else v
    if values.get("p_value", 0.01) >= 1:
        problems.append(GraphProblem("monitor.thresholds.p_value", f"p_value is {values['p_value']}", "use 0 < p < 1"))
        values.pop("p_value")
    return Thresholds(**values)


def _weights(problems: list[GraphProblem], data: Any) -> dict[str, float]:
    weights = dict(DEFAULT_WEIGHTS)
    raw = data.get("weights") if isinstance(data, dict) else None
    if data is not None and not isinstance(data, dict):
        problems.append(GraphProblem("monitor.health", f"health is {data!r}", "write health: {weights: {...}}"))
    if isinstance(data, dict):
        _unknown(problems, "monitor.health", data, {"weights"})
    if isinstance(raw, dict):
        _unknown(problems, "monitor.health.weights", raw, set(DEFAULT_WEIGHTS))
        for key in set(raw) & set(DEFAULT_WEIGHTS):
            v = _num(problems, f"monitor.health.weights.{key}", raw[key], positive=False)
            if v is not None and v >= 0:
                weights[key] = v
    return weights


def parse_monitor(data: Any, graph: Graph) -> MonitorConfig:
    """The ``monitor:`` mapping (None: defaults) checked against ``graph``; GraphError lists every problem."""
    if data is None:
        return MonitorConfig()
    problems: list[GraphProblem] = []
    if not isinstance(data, dict):
        raise GraphError([GraphProblem("monitor", f"monitor is {data!r}", "write monitor: {window: {size: 200}}")])
    _unknown(problems, "monitor", data, _KEYS)
    sample = _num(problems, "monitor.sample", data.get("sample", 1.0)) or 1.0
    if sample > 1:
        problems.append(GraphProblem("monitor.sample", f"sample is {sample:g}", "use a fraction in (0, 1]"))
    ref_size = _num(problems, "monitor.reference_size", data.get("reference_size", 1000)) or 1000
    config = MonitorConfig(
        window=_window(problems, data.get("window")),
        outputs=_outputs(problems, data.get("outputs"), graph),
        thresholds=_thresholds(problems, data.get("thresholds")),
        weights=_weights(problems, data.get("health")),
        sample=min(1.0, sample),
        reference_size=int(ref_size),
    )
    if problems:
        raise GraphError(problems, source=None if graph.source is None else str(graph.source))
    return config


def monitor_config(graph: Graph) -> MonitorConfig:
    """The ``monitor:`` section of the graph's file (defaults for a graph built in Python)."""
    if graph.source is None or not graph.source.is_file():
        return MonitorConfig()
    from usg.graph.loader import read_graph_file

    return parse_monitor(read_graph_file(graph.source).get("monitor"), graph)
