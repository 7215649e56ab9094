"""Bringing a graph's Serve application up: will it fit, and waiting for it with a diagnosis.

``serve.run`` waits forever for replicas that cannot be scheduled (a ``num_gpus: 1`` on a CPU
cluster) and reports a failed replica constructor as a bare exception. USG checks first
that every deployment fits the cluster's nodes (an error on a private local Ray, which can
never grow; a warning on a joined cluster, whose autoscaler may add nodes), then submits the
application without blocking and polls ``serve.status()``: progress for the CLI, the
deployments' own messages (Serve says which resources a pending replica needs, or what its
constructor raised) when the application fails or does not come up in time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from usg.errors import GraphError, GraphProblem, StateError
from usg.scale.ray_options import PlannedDeployment

__all__ = [
    "Unfit",
    "check_fits",
    "deployment_failure",
    "describe",
    "inflight_in_metrics",
    "router_inflight",
    "unfit_deployments",
    "wait_until_idle",
    "wait_until_running",
]


@dataclass(frozen=True)
class Unfit:
    deployment: str
    need: dict[str, float]  # per replica
    replicas: int
    why: str


def _needs(d: PlannedDeployment) -> tuple[dict[str, float], int]:
    actor = d.options.get("ray_actor_options", {})
    need = {"CPU": float(actor.get("num_cpus") or 0.0), "GPU": float(actor.get("num_gpus") or 0.0)}
    auto = d.options.get("autoscaling_config")
    replicas = int(auto["min_replicas"]) if auto else int(d.options.get("num_replicas", 1))
    return {k: v for k, v in need.items() if v > 0}, replicas


def unfit_deployments(plan: Sequence[PlannedDeployment], nodes: Sequence[Mapping[str, float]]) -> list[Unfit]:
    """Deployments whose replica fits on no node, or whose starting replicas (``num_replicas`` or
    ``min_replicas``) with all the others' exceed the cluster's totals."""
    out: list[Unfit] = []
    totals: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    wanted: dict[str, float] = {}
    for d in plan:
        need, replicas = _needs(d)
        largest = {k: max((float(n.get(k, 0.0)) for n in nodes), default=0.0) for k in need}
        short = {k: v for k, v in need.items() if v > largest[k]}
        if short:
            have = ", ".join(f"{k} {largest[k]:g}" for k in short)
            out.append(Unfit(d.name, need, replicas, f"no node has that (the largest has {have})"))
        for k, v in need.items():
            wanted[k] = wanted.get(k, 0.0) + v * replicas
    over = {k: v for k, v in wanted.items() if v > totals.get(k, 0.0)}
    if over and not out:
        for d in plan:
            need, replicas = _needs(d)
            if any(k in over for k in need):
                total = ", ".join(f"{k} {wanted[k]:g} wanted, {totals.get(k, 0.0):g} in the cluster" for k in over)
                out.append(Unfit(d.name, need, replicas, f"all starting replicas together do not fit ({total})"))
    return out


def check_fits(
    plan: Sequence[PlannedDeployment], *, private: bool, warn: Callable[[str], None], source: str | None = None
) -> None:
    """Raise (private local Ray: GraphError, the graph's ``deploy:`` is what to change; ``source``
    names the file) or warn (joined cluster) when deployments cannot be scheduled now."""
    import ray

    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    unfit = unfit_deployments(plan, nodes)
    if not unfit:
        return
    if private:
        kinds = {d.name: (d.kind, d.target) for d in plan}
        raise GraphError(
            [
                GraphProblem(
                    _deploy_key(*kinds.get(u.deployment, ("router", ""))),
                    f"{u.deployment} needs {_fmt(u.need)} per replica × {u.replicas}: {u.why}, "
                    "which this machine's private Ray cannot give",
                    "lower num_cpus / num_gpus / replicas there, or join a cluster that has the resources "
                    "(--ray-address)",
                )
                for u in unfit
            ],
            source=source,
        )
    lines = "; ".join(f"{u.deployment} needs {_fmt(u.need)} per replica × {u.replicas}: {u.why}" for u in unfit)
    warn(f"{lines}; waiting for the cluster to grow (an autoscaler) until the deploy timeout")


def _deploy_key(kind: str, target: str) -> str:
    """Where in the graph file a deployment is scaled: ``deploy.models.det``, ``deploy.nodes.lines``."""
    return "deploy.router" if kind == "router" else f"deploy.{kind}s.{target}"


def _fmt(need: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in need.items()) + "}" if need else "{}"


def describe(app: Any) -> str:
    """One line per deployment that is not healthy: status, replica states, Serve's message."""
    parts = []
    for name, d in sorted(app.deployments.items()):
        status = str(getattr(d.status, "value", d.status))
        if status == "HEALTHY":
            continue
        states = ", ".join(f"{getattr(k, 'value', k)} {v}" for k, v in sorted(d.replica_states.items(), key=str))
        message = _essence(str(d.message or ""))
        parts.append(f"{name}: {status} ({states or 'no replicas yet'}){': ' + message if message else ''}")
    return "\n".join(parts)


_ERROR_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception)(: |$)")


def _essence(message: str) -> str:
    """Serve's message, with a replica's traceback cut to its first sentence and the last error
    line (the replica's own exception; the rest is Serve's frames)."""
    lines = message.splitlines()
    errors = [line.strip() for line in lines if _ERROR_LINE.match(line)]
    if not errors:
        return " ".join(message.split())
    return f"{lines[0].split('. ')[0].strip()}: {errors[-1]}"


def wait_until_running(
    app_name: str,
    *,
    timeout_s: float,
    status: Callable[[], Any],
    progress: Callable[[str], None] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Poll ``status()`` (``serve.status``) until ``app_name`` runs; StateError with the
    deployments' messages when it fails or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        app = status().applications.get(app_name)
        state = str(getattr(app.status, "value", app.status)) if app is not None else "NOT_STARTED"
        if state == "RUNNING":
            return
        if app is not None and state in ("DEPLOY_FAILED", "UNHEALTHY"):
            detail = describe(app) or " ".join(str(app.message or "").split())
            raise StateError(
                f"Ray Serve could not deploy {app_name!r} ({state}):\n{detail}\n"
                "fix: the message above is the replica's own error (a model file missing on a worker node, "
                "a module not importable there, out of memory); `serve status` and the replica logs have more"
            )
        if time.monotonic() > deadline:
            detail = describe(app) if app is not None else "the application was not created"
            raise StateError(
                f"Ray Serve did not bring {app_name!r} up within {timeout_s:g} s ({state}):\n{detail}\n"
                "fix: replicas waiting to be scheduled need resources the cluster lacks (lower num_cpus / "
                "num_gpus / replicas in deploy:, or add nodes); slow model loading needs a longer --deploy-timeout"
            )
        if progress is not None and app is not None:
            pending = [
                name for name, d in app.deployments.items() if str(getattr(d.status, "value", d.status)) != "HEALTHY"
            ]
            if pending:
                progress(f"waiting for {', '.join(sorted(pending))}")
        time.sleep(poll_s)


def deployment_failure(app_name: str, deployment: str, status: Callable[[], Any]) -> str | None:
    """Why ``deployment`` of ``app_name`` will not answer: Serve gave up starting it
    (DEPLOY_FAILED, with its replicas' error), or its application is being deleted or gone;
    None while it may still come up (replicas loading or waiting for resources)."""
    app = status().applications.get(app_name)
    if app is None:
        return f"its application {app_name!r} no longer exists"
    app_state = str(getattr(app.status, "value", app.status))
    if app_state == "DELETING":
        return f"its application {app_name!r} is being deleted"
    d = app.deployments.get(deployment)
    if d is None:
        return f"the application {app_name!r} has no deployment {deployment!r}"
    if str(getattr(d.status, "value", d.status)) == "DEPLOY_FAILED":
        return f"{deployment} failed to start: {_essence(str(d.message or ''))}"
    return None


_INFLIGHT = re.compile(r"^usg_inflight_requests(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


def inflight_in_metrics(text: str) -> float | None:
    """``usg_inflight_requests`` in a router's /metrics text (None when absent)."""
    match = _INFLIGHT.search(text)
    return float(match.group(1)) if match else None


def router_inflight(url: str, timeout_s: float = 5.0) -> float | None:
    """The requests the router behind ``url`` is handling, read off its /metrics; None when it
    cannot be read (the proxy is on another node, or already gone). Never through ``http_proxy``:
    the URL is the local Serve proxy."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/metrics", timeout=timeout_s) as response:
            return inflight_in_metrics(response.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def wait_until_idle(
    inflight: Callable[[], float | None],
    *,
    timeout_s: float,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until ``inflight()`` (the router's requests in flight) is 0 or unreadable; False when
    ``timeout_s`` passed first. Deleting a Serve application takes every model deployment out of
    routing at once, so a request the router is still running would find no replica for its next
    model call and fail once Serve's graceful-shutdown timeout kills the router (a bare HTTP 500
    after 20 s): the caller waits for the router to finish first."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = inflight()
        if n is None or n <= 0:
            return True
        if time.monotonic() >= deadline:
            return False
        sleep(poll_s)
