"""Turn one request's decoded inputs and node outputs into an :class:`Observation` (same code offline
and live, so a reference profile and a live window are measured alike)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usg.graph.model import Graph
from usg.monitor.config import MonitorConfig
from usg.monitor.features import input_features
from usg.monitor.sketch import Observation, as_rows

__all__ = ["Tap"]


class Tap:
    def __init__(self, graph: Graph, config: MonitorConfig) -> None:
        self.graph = graph
        self.config = config
        self.modalities = {n: d.modality for n, d in graph.inputs.items()}

    @property
    def input_modalities(self) -> dict[str, str]:
        return {n: m.value for n, m in self.modalities.items()}

    def pick_outputs(self, values: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
        """The raw values of the watched outputs (references only: cheap, for the event loop)."""
        picked: dict[str, Any] = {}
        for watch in self.config.outputs:
            ref = watch.ref
            if ref.is_graph_input:
                value = values.get(ref.port)
            else:
                out = nodes.get(ref.source)
                value = None if out is None else out.get(ref.port)
            if value is not None:
                picked[watch.name] = value
        return picked

    def observe(
        self,
        t: float,
        values: Mapping[str, Any],
        outputs: Mapping[str, Any],
        meta: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Observation:
        meta = meta or {}
        obs = Observation(t)
        for name, value in values.items():
            modality = self.modalities.get(name)
            if modality is None:
                continue
            obs.features[name] = input_features(modality, value, meta.get(name))
        for name, value in outputs.items():
            rows = as_rows(value)
            if rows is not None:
                obs.outputs[name] = rows
        return obs
