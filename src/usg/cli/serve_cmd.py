"""``usg serve GRAPH``: the HTTP server (Starlette app on uvicorn, see :mod:`usg.serve.server`).

On SIGTERM/SIGINT the server turns not-ready and answers new requests 503 while it finishes
the requests it accepted, then closes the executor (finishing queued items) and exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
from types import FrameType

import click

from usg.cli.common import GRAPH_FILE, FiniteFloatRange, err_console, load_graph_for_cli
from usg.errors import MissingDependency, UsageError

__all__ = ["serve"]


def _ignore_signal(sig: int, frame: FrameType | None) -> None:
    return None


@click.command("serve")
@click.argument("graph_path", metavar="GRAPH", type=GRAPH_FILE)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option(
    "--grpc-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Also serve Triton's gRPC inference protocol (tritonclient.grpc) on this port; embedded engine only.",
)
@click.option(
    "--max-inflight",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Inference requests handled at once; more get 429 with Retry-After.",
)
@click.option(
    "--max-body-mb",
    default=None,
    type=FiniteFloatRange(min=0, min_open=True),
    help="Largest request body in MiB; larger bodies get 413. [default: the graph's limits.max_body_bytes, else 32]",
)
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=FiniteFloatRange(min=0, min_open=True),
    help="Per-request deadline in seconds (504 after it).",
)
@click.option(
    "--header-timeout",
    default=10.0,
    show_default=True,
    type=FiniteFloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Close a connection whose request headers are not complete by then (slow clients).",
)
@click.option(
    "--body-timeout",
    default=30.0,
    show_default=True,
    type=FiniteFloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Answer 408 and close when a request body has not fully arrived by then.",
)
@click.option(
    "--send-timeout",
    default=30.0,
    show_default=True,
    type=FiniteFloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Abort a connection whose client has read nothing of a response or event stream for this long (slow readers).",
)
@click.option(
    "--keepalive-timeout",
    default=5.0,
    show_default=True,
    type=FiniteFloatRange(min=1),
    metavar="SECONDS",
    help="Close an idle keep-alive connection after this long.",
)
@click.option(
    "--api-key-env",
    default=None,
    metavar="NAME",
    help="Require 'Authorization: Bearer <key>' on inference, metadata and /metrics, the key read from "
    "environment variable NAME (health stays open).",
)
@click.option(
    "--otel",
    type=click.Choice(["console", "otlp"]),
    default=None,
    help="Export OpenTelemetry spans (request, node, queue, compute) to stdout or OTLP.",
)
@click.option("--no-batching", is_flag=True, help="One backend call per item (ignore batch policies).")
@click.option(
    "--no-cache", is_flag=True, help="Turn every node cache off (the graph's cache: sections), e.g. to benchmark."
)
@click.option(
    "--reference",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A profile from `usg profile`: live drift and health on GET /v1/monitor and /metrics.",
)
@click.option(
    "--trace-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append USG's spans as OTLP/JSON lines (for `usg report slo`).",
)
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
    type=FiniteFloatRange(min=1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="With --engine ray: give up (with Serve's diagnosis) when deployments are not all running by then.",
)
@click.option(
    "--index",
    "index_path",
    default=None,
    metavar="INDEX",
    type=click.Path(exists=True, file_okay=False),
    help="Also serve POST /v1/search over this index (built by `usg index build` with this graph).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@click.option(
    "--stream-limit",
    "stream_limits",
    multiple=True,
    metavar="KEY=VALUE",
    help="A limit of each WS /v1/stream session (repeatable): max_chunk_bytes, max_chunks_per_s, burst, "
    "idle_timeout_s, max_pending_chunks, max_pending_events, slow_reader_s, max_sessions (docs/streaming.md).",
)
@click.option("--fp32", is_flag=True, help="Ignore GRAPH.quant.yaml (written by `usg quantize`); embedded engine.")
@click.option(
    "--cpu-slots",
    default=None,
    type=click.IntRange(min=0),
    metavar="N",
    help="Single-threaded CPU model calls run at once across models, a free core going to the step nearest "
    "the outputs (the CPU gate, docs/graph.md); 0 turns the gate off. [default: the usable cores]",
)
def serve(
    graph_path: str,
    host: str,
    port: int,
    grpc_port: int | None,
    max_inflight: int,
    max_body_mb: float | None,
    timeout: float,
    header_timeout: float,
    body_timeout: float,
    keepalive_timeout: float,
    send_timeout: float,
    api_key_env: str | None,
    otel: str | None,
    no_batching: bool,
    no_cache: bool,
    engine: str,
    ray_address: str | None,
    deploy_timeout: float,
    index_path: str | None,
    log_level: str,
    reference: str | None = None,
    trace_file: str | None = None,
    fp32: bool = False,
    stream_limits: tuple[str, ...] = (),
    cpu_slots: int | None = None,
) -> None:
    """Serve a graph over HTTP: /v1/infer, Open Inference Protocol v2 (/v2/...), /metrics."""
    if grpc_port is not None and engine == "ray":
        raise UsageError("--grpc-port needs the embedded engine (--engine ray serves HTTP only); fix: drop --grpc-port")
    if grpc_port is not None and grpc_port == port:
        raise UsageError(f"--grpc-port {grpc_port} is also the HTTP --port; fix: pick another --grpc-port")
    if engine == "ray" and (reference or trace_file):
        raise UsageError("--reference and --trace-file work with the embedded engine; fix: drop --engine ray")
    if engine == "ray":
        if index_path:
            raise UsageError("--index is served by the embedded engine only; fix: drop --engine ray or --index")
        if fp32:
            raise UsageError("--fp32 applies to the embedded engine only; fix: move GRAPH.quant.yaml away for Ray")
        if cpu_slots is not None:
            raise UsageError(
                "--cpu-slots applies to the embedded engine only (each Ray replica runs its own calls); "
                "fix: drop --cpu-slots with --engine ray"
            )
        if no_batching:
            raise UsageError(
                "--no-batching applies to the embedded engine only (Ray replicas batch with @serve.batch); "
                "fix: drop it with --engine ray"
            )
        ctx = click.get_current_context()
        for flag in ("api_key_env", "header_timeout", "body_timeout", "send_timeout", "keepalive_timeout"):
            if ctx.get_parameter_source(flag) is not click.core.ParameterSource.DEFAULT:
                option = "--" + flag.replace("_", "-")
                raise UsageError(
                    f"{option} applies to the embedded engine only (with --engine ray, Ray Serve's proxy is "
                    f"the HTTP server); fix: drop {option} with --engine ray"
                )
        from usg.cli.serve_ray import serve_on_ray

        serve_on_ray(
            graph_path,
            host,
            port,
            max_inflight,
            max_body_mb or 32.0,
            timeout,
            ray_address,
            otel,
            deploy_timeout,
            no_cache=no_cache,
            stream_limits=stream_limits,  # the router's WebSocket sessions (it was ignored under Ray before)
        )
        return
    if ray_address:
        raise UsageError("--ray-address needs --engine ray; fix: add --engine ray or drop --ray-address")
    source = click.get_current_context().get_parameter_source("deploy_timeout")
    if source is not None and source is not click.core.ParameterSource.DEFAULT:
        raise UsageError("--deploy-timeout needs --engine ray; fix: add --engine ray or drop --deploy-timeout")
    api_key = _api_key(api_key_env)
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingDependency("uvicorn", "serve", "usg serve") from None
    from usg.monitor.addon import serve_addons
    from usg.serve import ServeConfig, create_app, make_tracer_provider
    from usg.serve.server import UsgServer, hold_port, uvicorn_config
    from usg.stream import SessionLimits

    listen_on = hold_port(host, port)  # before loading models: a busy port fails at once, and stays ours
    grpc_held: socket.socket | None = None
    try:
        if grpc_port is not None:
            from usg.serve.grpc_server import attach_grpc, hold_grpc_port

            grpc_held = hold_grpc_port(host, grpc_port)  # the same for gRPC, until grpc listens on it
        graph = load_graph_for_cli(graph_path, quantized=not fp32)
        if no_cache:
            graph = graph.without_cache()
        if index_path:
            from usg.index.http import search_routes
        provider = make_tracer_provider(otel, service_name=f"usg:{graph.name}") if otel else None
        config = ServeConfig(
            max_inflight=max_inflight,
            max_body_bytes=int(max_body_mb * 2**20) if max_body_mb is not None else None,
            timeout_s=timeout,
            body_timeout_s=body_timeout,
            header_timeout_s=header_timeout,
            send_timeout_s=send_timeout,
            keepalive_timeout_s=keepalive_timeout,
            api_key=api_key,
            stream=SessionLimits.from_pairs(stream_limits),
        )
        addons = serve_addons(graph, reference=reference, trace_file=trace_file, batching=not no_batching)
        app = create_app(
            graph,
            batching=not no_batching,
            timeout_s=timeout,
            cpu_slots=cpu_slots,
            tracer_provider=provider,
            config=config,
            addons=addons,
            extra_routes=[search_routes(index_path)] if index_path else (),
        )
        ctx = app.state.usg
        if grpc_port is not None:
            attach_grpc(app, host, grpc_port, api_key=ctx.config.api_key, held=grpc_held)
        body_mib = ctx.limits.max_body_bytes / 2**20
        err_console.print(
            f"[dim]serving graph {graph.name!r} on http://{host}:{port}"
            + (f" and gRPC {host}:{grpc_port}" if grpc_port is not None else "")
            + " "
            f"(max in-flight {max_inflight}, body ≤ {body_mib:g} MiB, API key {'required' if api_key else 'off'})[/]"
        )
        _access_log(log_level)
        # uvicorn re-raises the signal that stopped it once its own handlers are gone; with the
        # default actions that would turn a cleanly drained exit into status -15 (or 130 for Ctrl-C)
        signal.signal(signal.SIGTERM, _ignore_signal)
        signal.signal(signal.SIGINT, _ignore_signal)
        UsgServer(uvicorn_config(app, ctx, host=host, port=port, log_level=log_level), ctx).run(sockets=[listen_on])
    finally:
        listen_on.close()  # a start-up error must not leave the port bound (uvicorn closed it if it ran)
        if grpc_held is not None:
            grpc_held.close()  # idem (closed already once grpc listened)


def _access_log(log_level: str) -> None:
    """USG's access log on stderr (one line per inference request, with the inputs' SHA-256), at info and below."""
    import logging

    logger = logging.getLogger("usg.access")
    if log_level in ("info", "debug") and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s usg.access %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    key = os.environ.get(name, "").strip()
    if not key:
        raise UsageError(
            f"--api-key-env {name}: the environment variable {name} is not set or empty; "
            f"fix: export {name}=<a long random key> before starting usg serve"
        )
    return key
