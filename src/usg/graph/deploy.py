"""The graph's ``deploy:`` section: replicas, autoscaling and resources per model and node.

Only the scale-out engines read it (``usg serve --engine ray``, ``usg export triton``);
the in-process executor ignores it. In YAML::

    deploy:
      router: {num_replicas: 1, num_cpus: 0.5}        # the ingress that runs the graph logic
      models:
        det: {min_replicas: 1, max_replicas: 4, target_ongoing_requests: 4, num_cpus: 1}
        rec: {num_replicas: 2}
        tokenizer: {own_deployment: true}             # a tokenizer in its own deployment (default: router)
      nodes:
        lines: {own_deployment: true}                 # a Python node in its own deployment

Unlisted models get a deployment of one replica; unlisted Python nodes run inside the router.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from usg.errors import GraphProblem
from usg.graph.keys import unknown_key

__all__ = ["DeployPolicy", "DeploySpec", "parse_deploy"]

_POLICY_KEYS = {
    "num_replicas",
    "min_replicas",
    "max_replicas",
    "target_ongoing_requests",
    "max_ongoing_requests",
    "num_cpus",
    "num_gpus",
    "own_deployment",
}
_TOP_KEYS = {"router", "models", "nodes"}


@dataclass(frozen=True)
class DeployPolicy:
    """How one deployment scales: a fixed replica count, or autoscaling bounds and target."""

    num_replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    max_ongoing_requests: int | None = None
    num_cpus: float | None = None
    num_gpus: float = 0.0
    # None: the kind's default (models get a deployment, Python nodes run in the router)
    own_deployment: bool | None = None

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def instances(self) -> int:
        """Replicas to start with (the fixed count, or the autoscaling minimum, at least 1)."""
        if self.num_replicas is not None:
            return self.num_replicas
        return max(1, self.min_replicas or 1)


@dataclass(frozen=True)
class DeploySpec:
    router: DeployPolicy = DeployPolicy()
    models: dict[str, DeployPolicy] = field(default_factory=dict)
    nodes: dict[str, DeployPolicy] = field(default_factory=dict)

    def model(self, name: str) -> DeployPolicy:
        return self.models.get(name, DeployPolicy())

    def node(self, name: str) -> DeployPolicy:
        return self.nodes.get(name, DeployPolicy())

    @property
    def own_nodes(self) -> list[str]:
        """Python nodes that run in a deployment of their own."""
        return [n for n, p in self.nodes.items() if p.own_deployment]

    @property
    def router_models(self) -> list[str]:
        """Models loaded (and batched) inside the router instead of a deployment of their own."""
        return [m for m, p in self.models.items() if p.own_deployment is False]


def _policy(where: str, data: Any, problems: list[GraphProblem], *, node: bool | None) -> DeployPolicy:
    """``node``: True for a Python node, False for a model, None for the router."""
    if not isinstance(data, Mapping):
        problems.append(GraphProblem(where, f"expected a mapping, got {data!r}", "write NAME: {num_replicas: N}"))
        return DeployPolicy()
    allowed = _POLICY_KEYS if node is not None else _POLICY_KEYS - {"own_deployment"}
    for key in data:
        if key not in allowed:
            problems.append(unknown_key(where, key, allowed))
    values: dict[str, Any] = {}
    for key, kind, minimum in (
        ("num_replicas", int, 1),
        ("min_replicas", int, 0),
        ("max_replicas", int, 1),
        ("target_ongoing_requests", float, 0.0),
        ("max_ongoing_requests", int, 1),
        ("num_cpus", float, 0.0),
        ("num_gpus", float, 0.0),
    ):
        if key not in data:
            continue
        value = data[key]
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= minimum
        )
        if kind is int and ok and int(value) != value:
            ok = False
        if not ok:
            problems.append(
                GraphProblem(f"{where}.{key}", f"{key} is {value!r}", f"use a finite {kind.__name__} ≥ {minimum}")
            )
            continue
        values[key] = kind(value)
    if "own_deployment" in data:
        if isinstance(data["own_deployment"], bool):
            values["own_deployment"] = data["own_deployment"]
        else:
            value = data["own_deployment"]
            problems.append(GraphProblem(f"{where}.own_deployment", f"own_deployment is {value!r}", "use true/false"))
    policy = DeployPolicy(**values)
    scaling = sorted(set(values) - {"own_deployment"})
    if policy.own_deployment is False and scaling:
        problems.append(
            GraphProblem(
                where,
                f"{', '.join(scaling)} set, but own_deployment is false (it runs inside the router)",
                "scale it through deploy.router, or drop own_deployment: false",
            )
        )
    if policy.num_replicas is not None and policy.autoscaling:
        problems.append(
            GraphProblem(
                where,
                "num_replicas is set together with min_replicas/max_replicas",
                "use num_replicas for a fixed count, or min_replicas/max_replicas to autoscale, not both",
            )
        )
    lo, hi = policy.min_replicas, policy.max_replicas
    if lo is not None and hi is not None and lo > hi:
        problems.append(
            GraphProblem(where, f"min_replicas {lo} > max_replicas {hi}", "make min_replicas ≤ max_replicas")
        )
    if policy.target_ongoing_requests is not None and not policy.autoscaling:
        problems.append(
            GraphProblem(
                f"{where}.target_ongoing_requests",
                "target_ongoing_requests only applies when autoscaling",
                "add min_replicas/max_replicas, or remove target_ongoing_requests",
            )
        )
    return policy


def _named(
    section: str, data: Any, known: Mapping[str, Any], what: str, problems: list[GraphProblem], *, node: bool | None
) -> dict[str, DeployPolicy]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        problems.append(GraphProblem(section, f"expected a mapping, got {data!r}", "write NAME: {num_replicas: N}"))
        return {}
    out: dict[str, DeployPolicy] = {}
    for name, pdata in data.items():
        where = f"{section}.{name}"
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(known)) or '(none)'}"
            problems.append(GraphProblem(where, f"{name!r} is not {what} of this graph", hint))
            continue
        out[str(name)] = _policy(where, pdata, problems, node=node)
    return out


def parse_deploy(
    data: Any, models: Mapping[str, Any], nodes: Mapping[str, Any]
) -> tuple[DeploySpec, list[GraphProblem]]:
    """Parse a ``deploy:`` mapping against the graph's model and node names."""
    problems: list[GraphProblem] = []
    if data is None:
        return DeploySpec(), problems
    if not isinstance(data, Mapping):
        problems.append(
            GraphProblem("deploy", f"expected a mapping, got {data!r}", "write deploy: {router: {...}, models: {...}}")
        )
        return DeploySpec(), problems
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(unknown_key("deploy", key, _TOP_KEYS))
    router = _policy("deploy.router", data.get("router") or {}, problems, node=None)
    model_policies = _named("deploy.models", data.get("models"), models, "a model", problems, node=False)
    fn_nodes = {n: d for n, d in nodes.items() if getattr(d, "fn", None) is not None}
    node_policies = _named("deploy.nodes", data.get("nodes"), fn_nodes, "a Python (fn:) node", problems, node=True)
    return DeploySpec(router, model_policies, node_policies), problems
