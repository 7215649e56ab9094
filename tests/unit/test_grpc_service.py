"""The gRPC front end in-process: tritonclient.grpc.aio against a real grpc.aio server on 127.0.0.1,
over a model-free graph; typed contents, error codes, overload, draining, API key, message limit."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")  # the serve extra (the grpc extra includes it)
grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc.aio as tga  # noqa: E402
from tritonclient.grpc import InferInput, InferRequestedOutput  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from usg.errors import InputError  # noqa: E402
from usg.graph import Graph, GraphBuilder  # noqa: E402
from usg.serve import ServeContext, create_app  # noqa: E402
from usg.serve.grpc_codec import parse_infer_request, requested_outputs  # noqa: E402
from usg.serve.grpc_server import attach_grpc, grpc_serving, hold_grpc_port  # noqa: E402
from usg.specs import TensorSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "serve"))

from procs import free_port  # noqa: E402


def graph() -> Graph:
    return (
        GraphBuilder("g")
        .input("text", "text", optional=True)
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)), optional=True)
        .node("echo", fn="slow_ops:slow_echo", inputs={"text": "inputs.text"})
        .node("dbl", fn="testops:identity", inputs={"x": "inputs.x"})
        .output("echo", "echo.text")
        .output("length", "echo.length")
        .output("x", "dbl.y")
        .build()
    )


@contextlib.asynccontextmanager
async def serving_at(
    api_key: str | None = None, max_calls: int | None = None, **kw: Any
) -> AsyncIterator[tuple[ServeContext, tga.InferenceServerClient, str]]:
    """A served graph, a tritonclient of it and its address (for raw grpc channels)."""
    app = create_app(graph(), **kw)
    ctx = app.state.usg
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        grpc_server = grpc_serving(ctx, "127.0.0.1", 0, api_key=api_key, max_calls=max_calls)
        port = await stack.enter_async_context(grpc_server)
        client = await stack.enter_async_context(tga.InferenceServerClient(f"127.0.0.1:{port}"))
        yield ctx, client, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def serving(
    api_key: str | None = None, max_calls: int | None = None, **kw: Any
) -> AsyncIterator[tuple[ServeContext, tga.InferenceServerClient]]:
    async with serving_at(api_key, max_calls, **kw) as (ctx, client, _):
        yield ctx, client


def text_input(*texts: str | bytes) -> InferInput:
    t = InferInput("text", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() if isinstance(x, str) else x for x in texts], dtype=object))
    return t


def request(*tensors: pb.ModelInferRequest.InferInputTensor, raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="g", inputs=list(tensors), raw_input_contents=raw or [])


def tensor(name: str, datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest.InferInputTensor:
    t = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if contents:
        t.contents.CopyFrom(pb.InferTensorContents(**contents))
    return t


def test_typed_contents_and_raw_contents_decode_alike() -> None:
    g = graph()
    typed = request(
        tensor("text", "BYTES", [1], bytes_contents=[b"hi"]),
        tensor("x", "FP32", [1, 3], fp32_contents=[1, 2, 3]),
    )
    raw = request(
        tensor("text", "BYTES", [1]),
        tensor("x", "FP32", [1, 3]),
        raw=[b"\x02\x00\x00\x00hi", np.array([1, 2, 3], dtype="<f4").tobytes()],
    )
    for req in (typed, raw):
        values = parse_infer_request(g, req)
        assert values["text"] == b"hi"
        np.testing.assert_array_equal(values["x"], np.array([[1, 2, 3]], dtype=np.float32))
    assert requested_outputs(g, typed) == ["echo", "length", "x"]


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (request(tensor("text", "BYTES", [1]), raw=[]), r"inputs\.text: shape \[1\] needs 1 elements but 0"),
        (request(tensor("text", "BYTES", [1]), tensor("x", "FP32", [1, 1]), raw=[b""]), "2 inputs but 1 raw"),
        (
            request(tensor("text", "BYTES", [1], bytes_contents=[b"a"]), raw=[b"\x01\x00\x00\x00a"]),
            "typed contents while the request also uses raw_input_contents",
        ),
        (request(tensor("x", "FP16", [1, 1])), "FP16' has no typed contents field; fix: send it in raw_input"),
        (request(tensor("x", "FLOAT", [1, 1])), "'FLOAT' is not a v2 datatype"),
        (request(tensor("x", "INT8", [1, 1], int_contents=[300])), "does not fit datatype INT8"),
        (request(tensor("x", "FP32", [1, 2]), raw=[b"\0" * 4]), r"4 bytes of binary data for shape \[1, 2\] FP32"),
        (request(tensor("x", "FP32", [1, -2]), raw=[b""]), "is not a list of non-negative ints"),
        (request(tensor("x", "INT64", [1, 1], int64_contents=[1])), "datatype INT64 does not match the input"),
        (request(tensor("text", "BYTES", [2], bytes_contents=[b"a", b"b"])), "expected 1 BYTES element"),
        (request(tensor("txt", "BYTES", [1], bytes_contents=[b"a"])), "unknown input 'txt'.*use the model's inputs"),
        (
            request(*[tensor("text", "BYTES", [1], bytes_contents=[b"a"])] * 2),
            "given more than once",
        ),
    ],
)
def test_bad_tensors_name_the_field_and_the_fix(req: pb.ModelInferRequest, match: str) -> None:
    with pytest.raises(InputError, match=match) as info:
        parse_infer_request(graph(), req)
    assert info.value.field and info.value.fix


def test_bad_requested_outputs() -> None:
    g = graph()
    req = pb.ModelInferRequest(model_name="g", outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="nope")])
    with pytest.raises(InputError, match="requested output 'nope' does not exist; fix: request some of: echo"):
        requested_outputs(g, req)
    out = pb.ModelInferRequest.InferRequestedOutputTensor(name="echo")
    out.parameters["classification"].int64_param = 2
    with pytest.raises(InputError, match="classification extension is not supported"):
        requested_outputs(g, pb.ModelInferRequest(model_name="g", outputs=[out]))


def test_infer_health_metadata_and_errors_with_tritonclient() -> None:
    async def scenario() -> None:
        async with serving() as (ctx, client):
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("g")
            meta = await client.get_model_metadata("g", as_json=True)
            assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("text", "BYTES"), ("x", "FP32")]
            x = InferInput("x", [1, 2], "FP32")
            x.set_data_from_numpy(np.array([[1.5, -2]], dtype=np.float32))
            r = await client.infer("g", [text_input("héllo"), x], request_id="my-id")
            assert r.as_numpy("echo").tolist() == [b"h\xc3\xa9llo"]
            assert r.as_numpy("length").tolist() == [5]
            np.testing.assert_array_equal(r.as_numpy("x"), [[1.5, -2]])
            assert r.get_response().id == "my-id"
            # output selection, and outputs of pruned branches are absent (not errors)
            only = await client.infer("g", [x], outputs=[InferRequestedOutput("x"), InferRequestedOutput("echo")])
            assert [o.name for o in only.get_response().outputs] == ["x"]
            assert "echo" in only.get_response().parameters["pruned_nodes"].string_param

            with pytest.raises(InferenceServerException, match=r"expected 1 BYTES element.*fix: send text") as info:
                await client.infer("g", [text_input("a", "b")])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            with pytest.raises(InferenceServerException, match="text is not valid UTF-8") as info:
                await client.infer("g", [text_input(b"\xff\xfe")])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            with pytest.raises(InferenceServerException, match="model 'other' version '' is not served") as info:
                await client.infer("other", [text_input("a")])
            assert info.value.status() == "StatusCode.NOT_FOUND"
            with pytest.raises(InferenceServerException, match="not served") as info:
                await client.is_model_ready("other")
            assert info.value.status() == "StatusCode.NOT_FOUND"
            # a failing node: INTERNAL, its message (which may name library paths) stays in the log
            with pytest.raises(
                InferenceServerException, match=r"internal error \(\w+\); details in the server log"
            ) as info:
                await client.infer("g", [text_input("sleep:never")])
            assert info.value.status() == "StatusCode.INTERNAL" and "float" not in str(info.value.message())
            metrics = ctx.metrics.render().decode()
            assert 'usg_grpc_requests_total{code="INVALID_ARGUMENT",method="ModelInfer"} 2.0' in metrics
            assert 'usg_rejected_requests_total{reason="bad_input"} 2.0' in metrics

    asyncio.run(scenario())


def test_overload_is_resource_exhausted_with_retry_advice() -> None:
    async def scenario() -> None:
        async with serving(max_inflight=1) as (ctx, client):
            slow = asyncio.ensure_future(client.infer("g", [text_input("sleep:1 a")]))
            while ctx.gate.inflight == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(InferenceServerException, match=r"at capacity.*retry after 1 s") as info:
                await client.infer("g", [text_input("b")])
            assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert (await slow).as_numpy("echo").tolist() == [b"sleep:1 a"]

    asyncio.run(scenario())


def test_calls_open_at_once_are_bounded_before_their_message_is_read() -> None:
    async def scenario() -> None:
        async with serving(max_calls=1) as (ctx, client):
            slow = asyncio.ensure_future(client.infer("g", [text_input("sleep:0.5 a")]))
            while ctx.gate.inflight == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(InferenceServerException, match="Concurrent RPC limit exceeded") as info:
                await client.infer("g", [text_input("b" * 100_000)])
            assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert (await slow).as_numpy("echo").tolist() == [b"sleep:0.5 a"]

    asyncio.run(scenario())


def test_draining_is_unavailable_and_not_ready() -> None:
    async def scenario() -> None:
        async with serving() as (ctx, client):
            ctx.begin_draining()
            assert not await client.is_server_ready()
            assert await client.is_server_live()
            with pytest.raises(InferenceServerException, match=r"shutting down.*retry on another replica") as info:
                await client.infer("g", [text_input("a")])
            assert info.value.status() == "StatusCode.UNAVAILABLE"

    asyncio.run(scenario())


def test_api_key_guards_inference_not_health() -> None:
    async def scenario() -> None:
        async with serving(api_key="s3cret") as (_, client):
            assert await client.is_server_live() and await client.is_server_ready() and await client.is_model_ready("g")
            with pytest.raises(InferenceServerException, match="no authorization metadata") as info:
                await client.get_model_metadata("g")
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
            assert await client.get_model_metadata("g", headers={"authorization": "bearer s3cret"})
            for headers, match in (
                (None, "no authorization metadata"),
                ({"authorization": "Bearer wrong"}, "does not carry the server's API key"),
            ):
                with pytest.raises(InferenceServerException, match=match + ".*authorization: Bearer") as info:
                    await client.infer("g", [text_input("a")], headers=headers)
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"

                async def one() -> AsyncIterator[dict[str, Any]]:
                    yield {"model_name": "g", "inputs": [text_input("a")]}

                with pytest.raises(grpc.aio.AioRpcError) as stream_info:  # tritonclient's stream does not wrap it
                    async for _ in client.stream_infer(one(), headers=headers):
                        pass
                assert stream_info.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert match in stream_info.value.details()
            ok = await client.infer("g", [text_input("a")], headers={"authorization": "Bearer s3cret"})
            assert ok.as_numpy("echo").tolist() == [b"a"]

    asyncio.run(scenario())


def test_stream_answers_every_message_and_errors_in_band() -> None:
    async def scenario() -> None:
        async with serving() as (_, client):

            async def messages() -> AsyncIterator[dict[str, Any]]:
                yield {"model_name": "g", "inputs": [text_input("sleep:0.3 first")], "request_id": "1"}
                yield {"model_name": "g", "inputs": [text_input("a", "b")], "request_id": "2"}
                yield {"model_name": "g", "inputs": [text_input("third")], "request_id": "3"}

            got: list[tuple[str, str]] = []
            async for result, error in client.stream_infer(messages()):
                if error is not None:
                    got.append(("error", str(error)))
                else:
                    got.append((result.get_response().id, result.as_numpy("echo")[0].decode()))
            # messages run concurrently: the slow first one is answered last
            assert len(got) == 3 and got[-1] == ("1", "sleep:0.3 first")
            assert ("3", "third") in got
            assert any(kind == "error" and "INVALID_ARGUMENT: text: expected 1 BYTES" in e for kind, e in got)

    asyncio.run(scenario())


def test_stream_messages_carry_the_streams_x_request_id() -> None:
    # before: ModelInfer took the client's x-request-id, but each ModelStreamInfer message got a
    # fresh random id, so a stream's requests could not be found by the id the client sent
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def scenario() -> None:
        async with serving(tracer_provider=provider) as (_, client):

            async def messages() -> AsyncIterator[dict[str, Any]]:
                for i in range(3):
                    yield {"model_name": "g", "inputs": [text_input(f"m{i}")], "request_id": str(i)}

            replies = [r async for r in client.stream_infer(messages(), headers={"x-request-id": "job-7"})]
            assert len(replies) == 3 and all(error is None for _, error in replies)

    asyncio.run(scenario())
    ids = sorted(
        str((s.attributes or {})["usg.request_id"]) for s in exporter.get_finished_spans() if s.name == "usg.request"
    )
    assert ids == ["job-7.1", "job-7.2", "job-7.3"]  # one per message, in the order they came


def test_open_streams_are_a_gauge() -> None:
    # before: the streams holding half of the gRPC call slots were seen only when one more was refused
    async def scenario() -> None:
        async with serving() as (ctx, client):
            more = asyncio.Event()

            async def messages() -> AsyncIterator[dict[str, Any]]:
                yield {"model_name": "g", "inputs": [text_input("one")], "request_id": "1"}
                await more.wait()

            def gauge() -> str:
                line = next(x for x in ctx.metrics.render().decode().splitlines() if x.startswith("usg_grpc_streams "))
                return line.split()[1]

            assert gauge() == "0.0"
            replies = client.stream_infer(messages())
            result, error = await anext(aiter(replies))
            assert error is None and result.as_numpy("echo").tolist() == [b"one"]
            assert gauge() == "1.0"
            more.set()
            assert [r async for r in replies] == []
            assert gauge() == "0.0"

    asyncio.run(scenario())


def test_message_above_the_body_limit_is_refused_by_grpc() -> None:
    async def scenario() -> None:
        async with serving(max_body_mb=0.01) as (_, client):
            with pytest.raises(InferenceServerException, match="larger than max") as info:
                await client.infer("g", [text_input("x" * 20_000)])
            assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert (await client.infer("g", [text_input("small")])).as_numpy("echo").tolist() == [b"small"]

    asyncio.run(scenario())


def test_attach_grpc_runs_with_the_app_lifespan_and_busy_ports_are_refused() -> None:
    port = free_port()
    held = hold_grpc_port("127.0.0.1", port)  # as usg serve, before the models load
    # held, not released: a plain bind of the port (no SO_REUSEADDR) is refused until grpc listens
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    app = create_app(graph())
    attach_grpc(app, "127.0.0.1", port, held=held)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            assert held.fileno() == -1  # closed once grpc listened on the port
            with pytest.raises(Exception, match=f"--grpc-port {port}: cannot listen on 127.0.0.1:{port}.*fix"):
                hold_grpc_port("127.0.0.1", port)
            async with tga.InferenceServerClient(f"127.0.0.1:{port}") as client:
                assert await client.is_server_ready()
        assert app.state.usg.state.value == "stopped"
        hold_grpc_port("127.0.0.1", port).close()  # released

    asyncio.run(scenario())


def test_a_held_grpc_port_is_closed_when_grpc_fails_to_start() -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        held = hold_grpc_port("127.0.0.1", port)  # both bound, neither listening: allowed
        busy.listen()  # another process listens on it before grpc does: grpc cannot bind
        app = create_app(graph())

        async def scenario() -> None:
            async with app.router.lifespan_context(app):
                with pytest.raises(Exception, match=f"--grpc-port {port}: cannot listen.*fix"):
                    async with grpc_serving(app.state.usg, "127.0.0.1", port, held=held):
                        pass

        asyncio.run(scenario())
        assert held.fileno() == -1


@pytest.mark.parametrize(
    ("args", "code", "match"),
    [
        (["--engine", "ray", "--grpc-port", "9001"], 2, "--grpc-port needs the embedded engine.*fix: drop --grpc-port"),
        (["--port", "9001", "--grpc-port", "9001"], 2, "--grpc-port 9001 is also the HTTP --port"),
        (["--grpc-port", "BUSY"], 1, "--grpc-port BUSY: cannot listen on 127.0.0.1:BUSY.*fix: stop the process"),
    ],
)
def test_cli_refuses_bad_grpc_ports_before_loading_models(
    args: list[str], code: int, match: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from usg.cli import main

    graph_file = tmp_path / "never-loaded.yaml"  # the refusals come before the graph is read
    graph_file.write_text("not: a graph\n")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        with pytest.raises(SystemExit) as exc:
            main(["serve", str(graph_file), *[port if a == "BUSY" else a for a in args]])
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == code
    assert re.search(match.replace("BUSY", port), err), err


def test_a_client_deadline_cancels_the_call_and_frees_its_slot() -> None:
    async def scenario() -> None:
        async with serving(max_inflight=1) as (ctx, client):
            with pytest.raises(InferenceServerException) as info:
                await client.infer("g", [text_input("sleep:0.5 a")], client_timeout=0.1)
            assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            while ctx.gate.inflight:
                await asyncio.sleep(0.01)
            assert (await client.infer("g", [text_input("b")])).as_numpy("echo").tolist() == [b"b"]
            assert ctx.executor.state.value == "running"

    asyncio.run(scenario())


@pytest.mark.parametrize(("module", "package"), [("grpc", "grpcio"), ("tritonclient.grpc", "tritonclient")])
def test_a_missing_grpc_extra_names_the_pip_line(monkeypatch: pytest.MonkeyPatch, module: str, package: str) -> None:
    import importlib

    from usg.errors import MissingDependency

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, "usg.serve.grpc_server")
    with pytest.raises(MissingDependency, match=rf"package '{package}'.*fix: pip install 'usg\[grpc\]'"):
        importlib.import_module("usg.serve.grpc_server")


def test_stream_limits_reach_the_ray_engine_and_bad_ones_fail_before_ray_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--stream-limit`` under ``--engine ray`` was dropped without a word (the router's sessions ran at the
    defaults); now it goes into the router's ServeConfig, and a bad one is refused before Ray is touched."""
    import usg.scale.ray_app as ray_app
    from usg.cli import main

    graph_file = tmp_path / "never-loaded.yaml"
    graph_file.write_text("not: a graph\n")
    monkeypatch.setattr(ray_app, "connect_ray", lambda *a: pytest.fail("Ray started despite a bad --stream-limit"))
    args = ["serve", str(graph_file), "--engine", "ray", "--stream-limit", "max_pending_chunkz=256"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "max_pending_chunkz" in err and "max_pending_chunks" in err  # the bad key, and the one meant

    seen: list[Any] = []

    def deploy(graph: Any, config: Any, **kw: Any) -> str:
        seen.append(config.stream)
        raise KeyboardInterrupt  # stop here (as a signal would): no Ray in the unit tier

    monkeypatch.setattr(ray_app, "connect_ray", lambda *a: None)
    monkeypatch.setattr(ray_app, "shutdown_ray", lambda: None)
    monkeypatch.setattr(ray_app, "deploy_graph", deploy)
    speech = Path(__file__).resolve().parents[2] / "examples" / "speech_stream" / "graph.yaml"
    args = ["serve", str(speech), "--engine", "ray", "--stream-limit", "max_pending_chunks=256"]
    with contextlib.suppress(SystemExit):
        main(args)
    assert [lim.max_pending_chunks for lim in seen] == [256]


def test_idle_streams_cannot_take_the_call_slots_of_unary_calls_and_health() -> None:
    """Streams hold a call slot for as long as they are open: at most half the slots may be streams,
    so a client that opens streams and sends nothing does not lock out ModelInfer and ServerLive."""
    message = pb.ModelInferRequest(model_name="g", inputs=[tensor("text", "BYTES", [1], bytes_contents=[b"b"])])

    async def scenario() -> None:
        async with serving_at(max_calls=4) as (_, client, address), grpc.aio.insecure_channel(address) as ch:
            stream = ch.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )
            idle = [stream() for _ in range(2)]  # open, nothing sent
            for call in idle:
                await call.wait_for_connection()
            refused = stream(timeout=10)  # the deadline only ends a hang (the call is refused at once)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await refused.read()
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert re.search(
                r"2 ModelStreamInfer streams are open \(limit 2: half of the 4 calls the server takes at once, .*"
                r"fix: send more messages on an open stream, close idle ones, or raise --max-inflight",
                info.value.details(),
            ), info.value.details()
            assert await client.is_server_live()
            assert (await client.infer("g", [text_input("a")])).as_numpy("echo").tolist() == [b"a"]
            for call in idle:  # streams that end free their places
                call.cancel()
            for _ in range(200):  # until the server has seen the cancellations
                again = stream(timeout=10)
                try:
                    await again.write(message)
                    await again.done_writing()
                    reply = await again.read()
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.02)
            assert not reply.error_message and reply.infer_response.model_name == "g"

    asyncio.run(scenario())
