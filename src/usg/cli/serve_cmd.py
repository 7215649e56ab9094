"""``usg serve GRAPH``: the HTTP server (Starlette app on uvicorn).

On SIGTERM/SIGINT the server stops accepting connections, turns not-ready, finishes the
requests it accepted, closes the executor (finishing queued items) and exits 0.
"""

from __future__ import annotations

import signal
from types import FrameType

import click

from usg.cli.common import err_console, load_graph_for_cli
from usg.errors import MissingDependency, UsageError

__all__ = ["serve"]


def _ignore_signal(sig: int, frame: FrameType | None) -> None:
    return None


@click.command("serve")
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option(
    "--max-inflight",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Inference requests handled at once; more get 429 with Retry-After.",
)
@click.option(
    "--max-body-mb",
    default=32.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Largest request body in MiB; larger bodies get 413.",
)
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Per-request deadline in seconds (504 after it).",
)
@click.option(
    "--otel",
    type=click.Choice(["console", "otlp"]),
    default=None,
    help="Export OpenTelemetry spans (request, node, queue, compute) to stdout or OTLP.",
)
@click.option("--no-batching", is_flag=True, help="One backend call per item (ignore batch policies).")
@click.option(
    "--engine",
    type=click.Choice(["embedded", "ray"]),
    default="embedded",
    show_default=True,
    help="embedded: one process (uvicorn). ray: each model a Ray Serve deployment, scaled by the graph's deploy:.",
)
@click.option(
    "--ray-address",
    default=None,
    metavar="ADDR",
    help="With --engine ray: the cluster to join (host:port, ray://host:10001, or auto for the one `ray start` "
    "runs here; default $RAY_ADDRESS, else a private local Ray).",
)
@click.option(
    "--deploy-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="With --engine ray: give up (with Serve's diagnosis) when deployments are not all running by then.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@click.option("--fp32", is_flag=True, help="Ignore GRAPH.quant.yaml (written by `usg quantize`); embedded engine.")
def serve(
    graph_path: str,
    host: str,
    port: int,
    max_inflight: int,
    max_body_mb: float,
    timeout: float,
    otel: str | None,
    no_batching: bool,
    engine: str,
    ray_address: str | None,
    deploy_timeout: float,
    log_level: str,
    fp32: bool = False,
) -> None:
    """Serve a graph over HTTP: /v1/infer, Open Inference Protocol v2 (/v2/...), /metrics."""
    if engine == "ray":
        if fp32:
            raise UsageError("--fp32 applies to the embedded engine only; fix: move GRAPH.quant.yaml away for Ray")
        if no_batching:
            raise UsageError(
                "--no-batching applies to the embedded engine only (Ray replicas batch with @serve.batch); "
                "fix: drop it with --engine ray"
            )
        from usg.cli.serve_ray import serve_on_ray

        serve_on_ray(graph_path, host, port, max_inflight, max_body_mb, timeout, ray_address, otel, deploy_timeout)
        return
    if ray_address:
        raise UsageError("--ray-address needs --engine ray; fix: add --engine ray or drop --ray-address")
    source = click.get_current_context().get_parameter_source("deploy_timeout")
    if source is not None and source is not click.core.ParameterSource.DEFAULT:
        raise UsageError("--deploy-timeout needs --engine ray; fix: add --engine ray or drop --deploy-timeout")
    try:
        import uvicorn
    except ImportError:
        raise MissingDependency("uvicorn", "serve", "usg serve") from None
    from usg.serve import create_app, make_tracer_provider

    graph = load_graph_for_cli(graph_path, quantized=not fp32)
    provider = make_tracer_provider(otel, service_name=f"usg:{graph.name}") if otel else None
    app = create_app(
        graph,
        batching=not no_batching,
        max_inflight=max_inflight,
        max_body_mb=max_body_mb,
        timeout_s=timeout,
        tracer_provider=provider,
    )
    ctx = app.state.usg

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            ctx.begin_draining()  # readiness false, new requests 503, before uvicorn closes the sockets
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=int(timeout) + 10,
    )
    err_console.print(
        f"[dim]serving graph {graph.name!r} on http://{host}:{port} "
        f"(max in-flight {max_inflight}, body ≤ {max_body_mb:g} MiB)[/]"
    )
    # uvicorn re-raises the signal that stopped it once its own handlers are gone; with the
    # default actions that would turn a cleanly drained exit into status -15 (or 130 for Ctrl-C)
    signal.signal(signal.SIGTERM, _ignore_signal)
    signal.signal(signal.SIGINT, _ignore_signal)
    _Server(config).run()
