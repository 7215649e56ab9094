"""``usg serve GRAPH --engine ray``: deploy the graph on Ray Serve and keep it up until a signal."""

from __future__ import annotations

import os
import signal
import time
from types import FrameType

from usg.cli.common import err_console, load_graph_for_cli
from usg.serve.app import ServeConfig

__all__ = ["serve_on_ray"]


def serve_on_ray(
    graph_path: str,
    host: str,
    port: int,
    max_inflight: int,
    max_body_mb: float,
    timeout: float,
    ray_address: str | None,
    otel: str | None = None,
    deploy_timeout: float = 300.0,
    *,
    no_cache: bool = False,
    stream_limits: tuple[str, ...] = (),
) -> None:
    from usg.scale.ray_app import connect_ray, deploy_graph, shutdown_ray
    from usg.stream import SessionLimits

    stream = SessionLimits.from_pairs(stream_limits)  # a bad --stream-limit fails before Ray starts

    graph = load_graph_for_cli(graph_path)
    if no_cache:
        graph = graph.without_cache()
    if otel:  # fail here, not in the router replica, when the exporter is not installed
        from usg.serve import make_tracer_provider

        make_tracer_provider(otel).shutdown()
    signals: list[int] = []
    starting = True  # Ray is starting: a signal is noted, and acted on once ray.init returns
    deploying = True

    def on_signal(sig: int, frame: FrameType | None) -> None:
        # no lock here (an Event's would deadlock when a second signal lands while the first
        # is handled: `timeout` and a process manager both sending SIGTERM, Ctrl-C twice)
        nonlocal deploying
        signals.append(sig)
        if starting and len(signals) == 1:
            return  # the first one while Ray starts is acted on when ray.init returns (see below)
        if deploying:
            deploying = False
            raise KeyboardInterrupt  # interrupt serve.run (or a Ray start signalled twice); cleaned up below

    # Installed before Ray starts: ray.init forks Ray's processes, and Python runs a handler that is
    # due at a fork inside the at-fork hooks (logging's), where a KeyboardInterrupt is printed as
    # "Exception ignored" and lost: Ctrl-C went unheeded and the graph was deployed. So while Ray
    # starts, the handler only notes the first signal (a second one interrupts the start)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with err_console.status("starting Ray"):
        connect_ray(ray_address)
    from ray import serve

    # again after ray.init (it sets its own SIGTERM handler, which would kill us uncleanly)
    # and before deploying: Serve's proxy answers /v2/health/ready as soon as the app is up
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    starting = False

    config = ServeConfig(
        max_inflight=max_inflight, max_body_bytes=int(max_body_mb * 2**20), timeout_s=timeout, stream=stream
    )
    joined = bool(ray_address or os.environ.get("RAY_ADDRESS"))
    deployed = submitted = False
    try:
        if signals:  # stopped while Ray was starting: deploy nothing
            raise KeyboardInterrupt
        submitted = True
        what = f"deploying {len(graph.models)} model deployment(s) and the router on Ray Serve"
        with err_console.status(what) as status:
            url = deploy_graph(
                graph,
                config,
                host=host,
                port=port,
                timeout_s=timeout,
                otel=otel,
                deploy_timeout_s=deploy_timeout,
                progress=lambda text: status.update(f"{what}: {text}"),
                warn=lambda text: err_console.print(f"[yellow]warning: {text}[/]"),
            )
        deploying = False
        deployed = True
        deployments = sorted(serve.status().applications[graph.name].deployments)
        err_console.print(f"[dim]serving graph {graph.name!r} on {url} with Ray Serve: {', '.join(deployments)}[/]")
        while not signals:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        deploying = False
        if signals:
            err_console.print("[dim]stopping: the router finishes accepted requests, then Serve shuts down[/]")
        try:
            if deployed:  # deleting the app takes the models out of routing at once: let the router finish first
                from usg.scale import ray_rollout

                local = url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://127.0.0.1:")
                asked = len(signals)  # one more signal (Ctrl-C again) stops the wait

                def inflight() -> float | None:
                    return None if len(signals) > asked else ray_rollout.router_inflight(local)

                if not ray_rollout.wait_until_idle(inflight, timeout_s=timeout):
                    err_console.print(
                        f"[yellow]requests still running after --timeout {timeout:g} s: stopping anyway[/]"
                    )
            if not joined:
                shutdown_ray()  # our private Ray: the application drains, then Ray stops
            elif deployed or (signals and submitted):  # (a failed deploy removed its application itself)
                # a signal can land after the deploy's wait saw the application running and before `deployed`
                # is set (Serve's proxy answers ready then): delete it then too; deleting one already gone is a no-op
                serve.delete(graph.name)  # leave the shared cluster's other applications alone
        except Exception as exc:  # do not hide the error that brought us here
            err_console.print(f"[yellow]Ray Serve clean-up failed: {type(exc).__name__}: {exc}[/]")
