"""Build and run a graph as a Ray Serve application.

One deployment per model (``model-NAME``; a model marked ``own_deployment: false`` is loaded
and batched inside the router instead), one per Python node marked
``deploy: {nodes: {NAME: {own_deployment: true}}}`` (``node-NAME``), and the ``router``
ingress that serves the HTTP API. Model files are loaded by the replicas, so on a
multi-node cluster every node must see them at the same path (shared file system or the
same image).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from usg.errors import MissingDependency, StateError, UsageError
from usg.graph.model import Graph
from usg.scale.ray_options import deployment_plan
from usg.serve.app import ServeConfig

__all__ = ["build_ray_app", "connect_ray", "deploy_graph"]


_MIN_RAY = (2, 60)


def _serve() -> Any:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise MissingDependency("ray", "ray", "usg serve --engine ray") from None
    version = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
    if version < _MIN_RAY:
        raise UsageError(
            f"usg serve --engine ray needs ray>={_MIN_RAY[0]}.{_MIN_RAY[1]}, installed is {ray.__version__}; "
            "fix: pip install -U 'usg[ray]'"
        )
    return serve


def connect_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at ``address`` (or ``$RAY_ADDRESS``), else start a local one."""
    _serve()
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        _probe(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise StateError(
                f"cannot join the Ray cluster at {address!r}: {str(exc).splitlines()[0]}; "
                "fix: start it (`ray start --head`), or pass the right --ray-address / RAY_ADDRESS"
            ) from None
    else:
        ray.init(
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a host:port cluster address does not answer (Ray itself retries for minutes)."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise StateError(
            f"cannot reach the Ray cluster at {address!r} ({exc}); fix: start it (`ray start --head`), "
            "or pass the right --ray-address / RAY_ADDRESS (host:port of the head node's GCS, or ray://host:10001)"
        ) from None


def build_ray_app(graph: Graph, config: ServeConfig, *, timeout_s: float = 60.0, otel: str | None = None) -> Any:
    """The Serve application (an ``Application`` to pass to ``serve.run``).

    ``otel`` (``console`` | ``otlp``) turns on the router's spans, as ``usg serve --otel`` does
    in-process; the caller's ``OTEL_*`` variables (endpoint, headers) go to the router replicas.
    """
    serve = _serve()
    from usg.scale.ray_replicas import FnReplica, ModelReplica
    from usg.scale.ray_router import Router

    models: dict[str, Any] = {}
    nodes: dict[str, Any] = {}
    ingress: Any = None
    for d in deployment_plan(graph, config.max_inflight):
        if d.kind == "model":
            models[d.target] = (
                serve.deployment(ModelReplica).options(name=d.name, **d.options).bind(graph.models[d.target])
            )
        elif d.kind == "node":
            nodes[d.target] = serve.deployment(FnReplica).options(name=d.name, **d.options).bind(graph.nodes[d.target])
        else:
            options = d.options
            if otel:
                options = {**options, "ray_actor_options": _with_otel_env(options["ray_actor_options"])}
            ingress = serve.deployment(serve.ingress()(Router)).options(name=d.name, **options)
    return ingress.bind(graph, models, nodes, config, timeout_s, otel)


def _with_otel_env(actor_options: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    if not env:
        return actor_options
    runtime_env = dict(actor_options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **runtime_env.get("env_vars", {})}
    return {**actor_options, "runtime_env": runtime_env}


def deploy_graph(
    graph: Graph,
    config: ServeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    timeout_s: float = 60.0,
    route_prefix: str = "/",
    otel: str | None = None,
) -> str:
    """Start Serve's HTTP proxy on host:port and deploy the graph; returns the base URL."""
    serve = _serve()
    import ray

    if not ray.is_initialized():
        raise UsageError("Ray is not initialised; fix: call usg.scale.ray_app.connect_ray() first")
    serve.start(http_options={"host": host, "port": port})
    app = build_ray_app(graph, config, timeout_s=timeout_s, otel=otel)
    serve.run(app, name=graph.name, route_prefix=route_prefix)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"
