"""Build a graph in Python; produces the same dataclasses and runs the same validation as YAML."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from usg.errors import GraphProblem
from usg.graph.align import ALIGN_FN, parse_align
from usg.graph.cache import parse_cache, resolve_node_cache
from usg.graph.deploy import parse_deploy
from usg.graph.limits import parse_limits
from usg.graph.model import BatchPolicy, Graph, InputDef, ModelDef, NodeDef, Ref
from usg.graph.state import StateSpec
from usg.graph.validate import validate_graph
from usg.specs import AudioSpec, Modality, TensorSpec

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Fluent builder::

    g = (GraphBuilder("embed")
         .input("text", "text")
         .model("tok", "tokenizer", path="tokenizer.json")
         .node("tok", model="tok", inputs={"text": "inputs.text"})
         .output("ids", "tok.input_ids")
         .build())
    """

    def __init__(self, name: str = "graph", *, base_dir: Path | None = None) -> None:
        self.name = name
        self.base_dir = base_dir
        self._inputs: dict[str, InputDef] = {}
        self._models: dict[str, ModelDef] = {}
        self._nodes: dict[str, NodeDef] = {}
        self._outputs: dict[str, Ref] = {}
        self._limits: dict[str, Any] = {}
        self._deploy: dict[str, Any] | None = None
        self._cache: dict[str, Any] | None = None
        self._node_cache: dict[str, Any] = {}
        self._problems: list[GraphProblem] = []

    def _ref(self, where: str, text: str) -> Ref:
        try:
            return Ref.parse(text)
        except ValueError as exc:
            self._problems.append(GraphProblem(where, str(exc), "write inputs.NAME or NODE.PORT"))
            return Ref("?", "?")

    def input(
        self,
        name: str,
        modality: Modality | str = Modality.TENSOR,
        *,
        spec: TensorSpec | None = None,
        optional: bool = False,
        audio: AudioSpec | None = None,
        timestamped: bool = False,
        max_items: int = 256,
    ) -> GraphBuilder:
        mod = Modality(modality)
        if spec is None and mod is Modality.IMAGE:
            spec = TensorSpec("uint8", ("H", "W", 3), layout="HWC")
        if audio is None and mod is Modality.AUDIO:
            audio = AudioSpec()
        self._inputs[name] = InputDef(name, mod, spec, optional, audio, timestamped, max_items)
        return self

    def model(
        self,
        name: str,
        backend: str = "onnxruntime",
        *,
        path: str | Path | None = None,
        options: Mapping[str, Any] | None = None,
        batch: BatchPolicy | None = None,
        input_specs: Mapping[str, TensorSpec] | None = None,
        state: StateSpec | None = None,
    ) -> GraphBuilder:
        resolved: Path | None = None
        if path is not None:
            from usg.paths import resolve_path

            resolved = resolve_path(str(path), self.base_dir)
        self._models[name] = ModelDef(
            name, backend, resolved, dict(options or {}), batch or BatchPolicy(), dict(input_specs or {}), state=state
        )
        return self

    def node(
        self,
        name: str,
        *,
        inputs: Mapping[str, str],
        model: str | None = None,
        fn: str | None = None,
        map: bool | str | list[str] = False,
        options: Mapping[str, Any] | None = None,
        cache: bool | Mapping[str, Any] | None = None,
    ) -> GraphBuilder:
        refs = {p: self._ref(f"nodes.{name}.inputs.{p}", r) for p, r in inputs.items()}
        if (model is None) == (fn is None):
            self._problems.append(
                GraphProblem(
                    f"nodes.{name}",
                    "a node needs exactly one of model or fn",
                    "pass model=MODEL_NAME or fn='package.module:function'",
                )
            )
        ports: tuple[str, ...] = ()
        if map is True:
            ports = tuple(refs)
        elif isinstance(map, str):
            ports = (map,)
        elif isinstance(map, list):
            ports = tuple(map)
        self._nodes[name] = NodeDef(name, refs, model, fn, ports, dict(options or {}))
        if cache is not None:
            self._node_cache[name] = cache
        return self

    def align(self, name: str, *, streams: Mapping[str, str], **settings: Any) -> GraphBuilder:
        """An ``align:`` node (:mod:`usg.graph.align`): ``streams`` maps stream names to references;
        ``settings``: ``tolerance_ms``, ``max_wait_ms``, ``on_missing``, ``time_keys``."""
        spec, raw, problems = parse_align(f"nodes.{name}.align", {"streams": dict(streams), **settings})
        self._problems.extend(problems)
        refs = {s: self._ref(f"nodes.{name}.align.streams.{s}", r) for s, r in raw.items()}
        options = spec.options() if spec is not None else {}
        self._nodes[name] = NodeDef(name, refs, fn=ALIGN_FN, options=options, align=spec)
        return self

    def output(self, name: str, ref: str) -> GraphBuilder:
        self._outputs[name] = self._ref(f"outputs.{name}", ref)
        return self

    def deploy(self, data: Mapping[str, Any]) -> GraphBuilder:
        """Set the ``deploy:`` section (same mapping as in YAML: router / models / nodes)."""
        self._deploy = dict(data)
        return self

    def limits(self, **limits: Any) -> GraphBuilder:
        """Set ``limits:`` entries (see :mod:`usg.graph.limits`), e.g. ``.limits(max_fanout_items=64)``."""
        self._limits.update(limits)
        return self

    def cache(self, **settings: Any) -> GraphBuilder:
        """Set the graph-level ``cache:`` section (see :mod:`usg.graph.cache`), e.g. ``.cache(default=True)``."""
        self._cache = dict(settings)
        return self

    def build(self) -> Graph:
        problems = list(self._problems)
        graph_cache, cache_problems = parse_cache(self._cache)
        problems += cache_problems
        for name, raw in self._node_cache.items():
            spec, node_problems = resolve_node_cache(name, raw, graph_cache)
            problems += node_problems
            self._nodes[name] = dataclasses.replace(self._nodes[name], cache=spec)
        if graph_cache is not None and graph_cache.default:
            for name, node in self._nodes.items():
                if name not in self._node_cache:
                    self._nodes[name] = dataclasses.replace(node, cache=resolve_node_cache(name, None, graph_cache)[0])
        if not self._outputs:
            problems.append(GraphProblem("outputs", "the graph declares no outputs", "call .output(NAME, 'NODE.PORT')"))
        deploy, deploy_problems = parse_deploy(self._deploy, self._models, self._nodes)
        limits, limit_problems = parse_limits(self._limits)
        problems += limit_problems
        return validate_graph(
            self.name,
            self._inputs,
            self._models,
            self._nodes,
            self._outputs,
            limits=limits,
            problems=problems + deploy_problems,
            deploy=deploy,
            cache=graph_cache,
        )
