"""The Ray Serve deployment options of a graph's model, Python node or router deployment.

Derived from the graph: ``deploy:`` gives replicas, autoscaling and resources (tokenizer and
``openai`` models run in the router unless ``own_deployment: true``); a model's
``batch:`` policy and ``options.concurrency`` give how many requests a replica must be
allowed to hold (enough to fill ``concurrency`` batches of ``max_size``).

Streaming sessions place nodes by one rule: a stateful model's state travels with each chunk
(an input of the call, an output of the reply), so its replicas need no session affinity; a
*stream node* — a Python node whose function takes ``session_state``, ``ts_ms`` or ``flush``
(:data:`usg.runtime.streams.STREAM_PARAMS`), e.g. the VAD segmenter — keeps per-session Python
state in the router's session, so it runs in the router: ``own_deployment: true`` on one is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from usg.errors import GraphError, GraphProblem
from usg.graph.deploy import DeployPolicy
from usg.graph.model import Graph

__all__ = [
    "ROUTER_BACKENDS",
    "PlannedDeployment",
    "deployment_name",
    "deployment_plan",
    "fn_options",
    "model_options",
    "router_options",
    "stream_node_problems",
]

_SAFE = re.compile(r"[^A-Za-z0-9_-]")
# backends the router runs itself unless deploy: says otherwise: a tokenizer costs less than the
# hop to a replica, and an engine model (openai) is a client of an engine that batches on its own
ROUTER_BACKENDS = frozenset({"tokenizer", "openai"})


def deployment_name(kind: str, name: str) -> str:
    """``model-det``, ``node-lines``, ``router``: stable names Serve shows in its status."""
    return f"{kind}-{_SAFE.sub('_', name)}" if name else kind


def _options(policy: DeployPolicy, max_ongoing: int) -> dict[str, Any]:
    actor: dict[str, Any] = {"num_cpus": policy.num_cpus if policy.num_cpus is not None else 0}
    if policy.num_gpus:
        actor["num_gpus"] = policy.num_gpus
    opts: dict[str, Any] = {
        "ray_actor_options": actor,
        "max_ongoing_requests": policy.max_ongoing_requests or max_ongoing,
    }
    if policy.autoscaling:
        lo = policy.min_replicas if policy.min_replicas is not None else 1
        hi = policy.max_replicas if policy.max_replicas is not None else max(1, lo)
        auto: dict[str, Any] = {"min_replicas": lo, "max_replicas": hi}
        if policy.target_ongoing_requests is not None:
            auto["target_ongoing_requests"] = policy.target_ongoing_requests
        opts["autoscaling_config"] = auto
    else:
        opts["num_replicas"] = policy.num_replicas or 1
    return opts


def model_options(graph: Graph, model: str) -> dict[str, Any]:
    m = graph.models[model]
    if m.backend == "openai":  # an engine's client holds max_inflight requests at the engine, queues the rest
        return _options(graph.deploy.model(model), max(16, 2 * int(m.options.get("max_inflight", 8))))
    concurrency = m.concurrency
    # a replica must hold enough requests to fill its concurrent batches, twice over
    return _options(graph.deploy.model(model), max(16, 2 * m.batch.max_size * concurrency))


def fn_options(graph: Graph, node: str) -> dict[str, Any]:
    return _options(graph.deploy.node(node), 64)


def router_options(graph: Graph, max_inflight: int) -> dict[str, Any]:
    # the router's own in-flight gate answers 429 past max_inflight; Serve must not queue before it
    return _options(graph.deploy.router, max_inflight + 16)


@dataclass(frozen=True)
class PlannedDeployment:
    """One Serve deployment the Ray engine will create for a graph."""

    name: str  # model-det, node-lines, router
    kind: str  # model | node | router
    target: str  # the graph model or node name ("" for the router)
    options: dict[str, Any]
    runs_in_router: tuple[str, ...] = ()  # router only: models and Python nodes it runs itself


def stream_node_problems(graph: Graph) -> list[GraphProblem]:
    """Stream nodes marked ``own_deployment: true``: their per-session state lives in the router."""
    from usg.callables import accepted_params, import_callable
    from usg.runtime.streams import STREAM_PARAMS

    problems = []
    for name in graph.deploy.own_nodes:
        node = graph.nodes.get(name)
        if node is None or node.fn is None:
            continue
        names, _ = accepted_params(import_callable(node.fn))
        taken = [p for p in STREAM_PARAMS if p in names]
        if taken:
            problems.append(
                GraphProblem(
                    f"deploy.nodes.{name}.own_deployment",
                    f"node {name!r} (fn {node.fn}) is a stream node (it takes {', '.join(taken)}): its "
                    "per-session state lives in the router's session, so it cannot run in a deployment of its own",
                    f"remove deploy.nodes.{name}.own_deployment (stream nodes run in the router; a stateful "
                    "model's state travels with each chunk, so the model keeps its own deployment)",
                )
            )
    return problems


def deployment_plan(graph: Graph, max_inflight: int = 64) -> list[PlannedDeployment]:
    """Every deployment ``usg serve --engine ray`` creates for ``graph``, with its options;
    GraphError when a stream node is placed outside the router (:func:`stream_node_problems`)."""
    problems = stream_node_problems(graph)
    if problems:
        raise GraphError(problems, source=str(graph.source) if graph.source else None)
    used = [m for m in graph.models if any(n.model == m for n in graph.nodes.values())]
    in_router = set(graph.deploy.router_models) | {
        m for m in used if graph.models[m].backend in ROUTER_BACKENDS and graph.deploy.model(m).own_deployment is None
    }
    plan = [
        PlannedDeployment(deployment_name("model", m), "model", m, model_options(graph, m))
        for m in used
        if m not in in_router
    ]
    own = set(graph.deploy.own_nodes)
    plan += [
        PlannedDeployment(deployment_name("node", n), "node", n, fn_options(graph, n)) for n in graph.deploy.own_nodes
    ]
    local = [f"model {m}" for m in used if m in in_router]
    local += [f"node {n}" for n, d in graph.nodes.items() if d.fn is not None and n not in own]
    plan.append(PlannedDeployment("router", "router", "", router_options(graph, max_inflight), tuple(local)))
    return plan
