"""Build and run a graph as a Ray Serve application.

One deployment per model (``model-NAME``; a model marked ``own_deployment: false`` is loaded
and batched inside the router instead), one per Python node marked
``deploy: {nodes: {NAME: {own_deployment: true}}}`` (``node-NAME``), and the ``router``
ingress that serves the HTTP API. Model files are loaded by the replicas, so on a
multi-node cluster every node must see them at the same path (shared file system or the
same image).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from usg.errors import MissingDependency, StateError, UsageError
from usg.graph.model import Graph
from usg.scale.ray_options import deployment_plan
from usg.scale.transport import grpc_env, output_reducers
from usg.serve.app import ServeConfig

__all__ = ["build_ray_app", "connect_ray", "deploy_graph", "shutdown_ray"]


_MIN_RAY = (2, 60)
log = logging.getLogger("usg.scale.ray")
_started_here = False  # connect_ray started a private local Ray (it can never grow)


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
    """Join the Ray cluster at ``address`` (or ``$RAY_ADDRESS``; ``auto``: the one ``ray start``
    runs on this machine), else start a private local one (even if ``ray start`` runs here)."""
    global _started_here
    _serve()
    import ray

    if ray.is_initialized():
        return
    given = "--ray-address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        _started_here = False
        _not_a_dashboard_url(address, given)
        _probe(address, given=given)
        token = _use_token_if_available()
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            auth = (
                "the token USG sent (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) may not be "
                "the cluster's: `ray get-auth-token` on the head node prints it"
                if token
                else "if the cluster uses token authentication (`ray start` turns it on where a token "
                "exists, Ray >= 2.59), put its token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
            )
            raise StateError(
                f"cannot join the Ray cluster at {address!r} ({given}): {str(exc).splitlines()[0]}; "
                f"fix: start it (`ray start --head`), or pass the right --ray-address / RAY_ADDRESS; {auth}"
            ) from None
    else:
        _started_here = True
        _private_auth()
        _private_env()
        ray.init(
            address="local",  # not a cluster `ray start` left running here: that one is --ray-address auto
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        _stop_log_monitor()


def _stop_log_monitor() -> None:
    """Stop the private Ray's log monitor: it only forwards the workers' output to drivers that
    ask for it (``log_to_driver``, off here) and scans the log directory ten times a second to
    do so — 22 ms of CPU a second with no request (benchmarks/README.md, "Session 9"). The logs
    stay in the session directory's files, where ``ray logs`` and a dashboard read them."""
    try:
        from ray._private import ray_constants, worker

        node = worker._global_node
        if node is None:
            return
        infos = node.all_processes.get(ray_constants.PROCESS_TYPE_LOG_MONITOR, [])
        procs = [info.process for info in infos]
        node.kill_log_monitor(check_alive=False)  # (Ray forgets its Popen: wait for it here)
    except Exception as exc:  # a Ray without these internals: the monitor keeps running, harmlessly
        log.debug("could not stop Ray's log monitor: %s", exc)
        return
    _reap(procs, timeout_s=5.0)


_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
_auth_set_here: list[str] = []  # what _private_auth put in os.environ, for shutdown_ray to remove

#: Settings of the Ray processes a private local Ray runs (its controller, proxy and replicas
#: inherit this process's environment), each measured on the 2-core machine of
#: benchmarks/README.md ("Session 9: Ray engine CPU"); a value the user set is kept.
PRIVATE_RAY_ENV = {
    # Serve's controller loop runs every 0.1 s by default, and with it the controller's GCS
    # calls: 45 ms of CPU a second with no request at all. A replica restart, a health-check
    # verdict or an autoscaling decision now waits up to this long more
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # Serve's own metrics are flushed from every replica, handle and the proxy every 0.1 s; a
    # private Ray exports them nowhere (no dashboard) — USG's router has its own /metrics
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    # Serve's log lines go to its log files (logs/serve/ in the session directory); not also to
    # each worker's stderr, which Ray's log monitor tails and publishes for drivers (USG's
    # driver does not subscribe: log_to_driver=False)
    "RAY_SERVE_LOG_TO_STDERR": "0",
}
_env_set_here: list[str] = []  # what _private_env put in os.environ, for shutdown_ray to remove


def _private_env() -> None:
    """:data:`PRIVATE_RAY_ENV` into this process's environment (inherited by the Ray it starts)."""
    for key, value in PRIVATE_RAY_ENV.items():
        if key not in os.environ:
            os.environ[key] = value
            _env_set_here.append(key)


def _private_auth() -> None:
    """Token authentication for a private local Ray, without writing ``~/.ray/auth_token``.

    A local ``ray.init()`` of Ray >= 2.59 turns token authentication on and, when no token
    exists, writes a new one to ``~/.ray/auth_token`` (and from then on every Ray start on the
    machine logs "Token authentication is enabled"). USG's private Ray keeps the
    authentication but holds its token in this process's environment (inherited by the Ray
    processes it starts), so the user's home is left as it was. A ``RAY_AUTH_MODE`` or a token
    the user set (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``) is used as is.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication import authentication_token_setup as setup
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication writes no token either
        return
    home_token = Path.home() / ".ray" / "auth_token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or home_token.exists()):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        _auth_set_here.append("RAY_AUTH_TOKEN")
    _auth_set_here.append("RAY_AUTH_MODE")
    setup._enable_token_auth()  # RAY_AUTH_MODE=token, re-read by this process's Ray config
    AuthenticationTokenLoader.instance().reset_cache()


def shutdown_ray() -> None:
    """Stop what :func:`connect_ray` started or joined, quietly: on a private Ray the Serve
    applications are deleted first (their replicas finish accepted requests), then Ray stops
    with its controller — ``serve.shutdown()`` there would kill the controller under its own
    pending ``graceful_shutdown`` call, which Ray reports as a failed task with raw colour codes.
    On a joined cluster only this process disconnects."""
    global _started_here
    import ray

    if ray.is_initialized():
        if _started_here:
            from ray import serve

            try:
                names = list(serve.status().applications)
            except Exception:  # Serve never started here
                names = []
            for name in names:
                serve.delete(name)
        if _started_here:
            stop_private_ray()
        else:
            ray.shutdown()
    _started_here = False
    while _auth_set_here:
        os.environ.pop(_auth_set_here.pop(), None)
    while _env_set_here:
        os.environ.pop(_env_set_here.pop(), None)


def stop_private_ray() -> None:
    """``ray.shutdown()`` of a Ray this process started, then wait for its processes (raylet, GCS,
    ...) so none is left running with an unwaited ``Popen`` (see :func:`_reap`)."""
    import ray

    children = _ray_children()
    ray.shutdown()
    _reap(children)


def _ray_children() -> list[Any]:
    """The ``Popen`` objects of the Ray processes this process started (raylet, GCS, dashboard...)."""
    try:
        from ray._private import worker

        node = worker._global_node
        return [info.process for infos in node.all_processes.values() for info in infos] if node else []
    except Exception:  # a Ray without these internals: nothing to reap here
        return []


def _reap(children: list[Any], timeout_s: float = 20.0) -> None:
    """Wait for Ray's processes after ``ray.shutdown()``: on a loaded machine Ray abandons one that
    is slow to die (its reap timeout), which would linger as a zombie with an unwaited ``Popen``."""
    deadline = time.monotonic() + timeout_s
    for proc in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # still alive past the deadline: kill it, then reap it
            proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


def _use_token_if_available() -> bool:
    """Send the Ray auth token when joining a cluster, if one is at hand; whether one is sent.

    ``ray start --head`` turns token authentication on where a token exists (``~/.ray/auth_token``,
    which any local ``ray.init()`` of Ray >= 2.59 writes), but a driver joining by address sends
    it only with ``RAY_AUTH_MODE=token`` (Ray 2.61 makes that the default). A cluster without
    authentication ignores the token. An explicit ``RAY_AUTH_MODE`` is left as it is.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    try:
        from ray._private.authentication import authentication_token_setup as setup
    except ImportError:  # a Ray without token authentication
        return False
    quiet = logging.getLogger(setup.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its warning speaks of starting a cluster, not of joining one
    try:
        return bool(setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False))
    finally:
        quiet.setLevel(level)


def _not_a_dashboard_url(address: str, given: str) -> None:
    """Refuse an http(s):// address: that is the dashboard / Jobs API, which ``ray job submit`` reads
    from RAY_API_SERVER_ADDRESS or RAY_ADDRESS (so RAY_ADDRESS often holds one), not an address a driver joins."""
    if address.lower().startswith(("http://", "https://")):
        raise UsageError(
            f"{given} is {address!r}, an HTTP address: that is the Ray dashboard / Jobs API (what `ray job "
            "submit` takes, from RAY_API_SERVER_ADDRESS or RAY_ADDRESS), and usg serve joins the cluster as a "
            "driver; fix: pass the head node's GCS address (host:6379), ray://host:10001 (Ray Client), or auto "
            "(the cluster `ray start` runs here)"
            + ("; or unset RAY_ADDRESS for a private local Ray" if given == "RAY_ADDRESS" else "")
        )


def _probe(address: str, timeout_s: float = 5.0, *, given: str = "--ray-address") -> None:
    """Fail fast when a host:port cluster address does not answer (Ray itself retries for minutes)."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise StateError(
            f"cannot reach the Ray cluster at {address!r} ({given}: {exc}); fix: start it (`ray start --head`), "
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
    reducers = output_reducers(graph)  # e.g. rec's T x 6625 probabilities -> their best path
    for d in deployment_plan(graph, config.max_inflight):
        env = deployment_env(d.kind, otel=bool(otel))
        options = {
            **d.options,
            "ray_actor_options": _with_env(d.options["ray_actor_options"], env),
            # no Serve access-log line per call: the proxy logs each HTTP request, the router's
            # /metrics counts every model call; a line per hop cost each replica CPU per request
            "logging_config": {"enable_access_log": False},
        }
        if d.kind == "model":
            model = graph.models[d.target]
            reduce = reducers.get(d.target, {})
            models[d.target] = serve.deployment(ModelReplica).options(name=d.name, **options).bind(model, reduce)
        elif d.kind == "node":
            nodes[d.target] = serve.deployment(FnReplica).options(name=d.name, **options).bind(graph.nodes[d.target])
        else:
            ingress = serve.deployment(serve.ingress()(Router)).options(name=d.name, **options)
    return ingress.bind(graph, models, nodes, config, timeout_s, otel)


def deployment_env(kind: str, *, otel: bool = False) -> dict[str, str]:
    """Environment variables of a deployment's replicas: the gRPC message limit for all (every
    process on the gRPC hop accepts the graph's large replies), and for the router with
    ``otel`` the caller's ``OTEL_*`` variables (endpoint, headers)."""
    env = grpc_env()
    if kind == "router" and otel:
        env.update({k: v for k, v in os.environ.items() if k.startswith("OTEL_")})
    return env


def _with_env(actor_options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
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
    deploy_timeout_s: float = 300.0,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] = log.warning,
) -> str:
    """Start Serve's HTTP proxy on host:port and deploy the graph; returns the base URL once every
    deployment runs. GraphError up front when the deployments cannot fit a private local Ray;
    StateError with Serve's diagnosis when they fail or are not up within ``deploy_timeout_s``
    (the application is deleted then, as when the wait is interrupted)."""
    serve = _serve()
    import ray

    from usg.scale.ray_rollout import check_fits, wait_until_running

    if not ray.is_initialized():
        raise UsageError("Ray is not initialised; fix: call usg.scale.ray_app.connect_ray() first")
    source = str(graph.source) if graph.source else None
    check_fits(deployment_plan(graph, config.max_inflight), private=_started_here, warn=warn, source=source)
    serve.start(http_options={"host": host, "port": port})
    _check_proxy_address(host, port)
    app = build_ray_app(graph, config, timeout_s=timeout_s, otel=otel)
    target = serve.RunTarget(app, name=graph.name, route_prefix=route_prefix)
    if graph.name in serve.status().applications:
        warn(f"application {graph.name!r} already runs on this cluster: Serve updates it in place; stopping deletes it")
    quiet_reconnect_notice()
    serve.run_many([target], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    try:
        wait_until_running(graph.name, timeout_s=deploy_timeout_s, status=serve.status, progress=progress)
    except BaseException:  # failed, timed out or interrupted: remove what this call deployed
        serve.delete(graph.name)
        raise
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"


class _NoReconnectNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Connecting to existing Serve app")


def quiet_reconnect_notice() -> None:
    """Drop Serve's "Connecting to existing Serve app ... New http_options/controller_options will
    not be applied." line: ``serve.run_many`` prints it after the ``serve.start`` that
    :func:`deploy_graph` just made, on every start, which reads as if ``--host``/``--port`` were
    ignored (they are not; :func:`_check_proxy_address` says so when Serve really runs elsewhere)."""
    serve_log = logging.getLogger("ray.serve")
    if not any(isinstance(f, _NoReconnectNotice) for f in serve_log.filters):
        serve_log.addFilter(_NoReconnectNotice())


def _check_proxy_address(host: str, port: int) -> None:
    """Serve keeps one HTTP proxy address per cluster: when it already ran there, ``serve.start``
    keeps the old address; say so instead of claiming a URL nothing listens on."""
    try:
        from ray.serve.context import _get_global_client  # the only way to read the live address

        client = _get_global_client()
        if client is None:
            return
        config = client.http_config
        actual_host, actual_port = str(config.host), int(config.port)
    except Exception:  # a Ray that moved it: nothing to compare
        return
    wildcard = actual_host in ("0.0.0.0", "::")
    if actual_port != port or (actual_host != host and not wildcard):
        raise UsageError(
            f"Ray Serve already runs on this cluster with its HTTP proxy on {actual_host}:{actual_port}, "
            f"not the {host}:{port} asked for (Serve has one proxy address per cluster and cannot move it "
            f"while running); fix: pass --host {actual_host} --port {actual_port}, or run `serve shutdown` "
            "on the cluster first (it stops every Serve application there)"
        )
