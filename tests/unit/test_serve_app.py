"""The HTTP app on fake backends: /v1 JSON and multipart, /v2 JSON and binary, limits, errors, draining."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="needs the serve extra: pip install -e '.[serve]'")

import asyncio
import base64
import io
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install 'usg[serve]'")

from PIL import Image
from starlette.testclient import TestClient

from usg.graph import BatchPolicy, Graph, GraphBuilder
from usg.runtime import Executor
from usg.serve import ServeState, create_app
from usg.serve.binary import encode_bytes_elements
from usg.specs import TensorSpec
from usg.testing import FakeBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "serve"))


def doubler(delay: float = 0.0) -> FakeBackend:
    def handler(inp: Any) -> dict[str, Any]:
        time.sleep(delay)
        return {"y": inp["x"] * 2}

    return FakeBackend(
        handler, {"x": TensorSpec("float32", ("batch", None))}, {"y": TensorSpec("float32", ("batch", None))}
    )


def tiny_graph(max_pixels: int = 10_000, max_queue: int = 256) -> Graph:
    return (
        GraphBuilder("tiny")
        .input("text", "text", optional=True)
        .input("image", "image", optional=True)
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)), optional=True)
        .model(
            "m",
            "python",
            options={"callable": "testops:identity"},
            batch=BatchPolicy(max_size=4, max_delay_ms=2, max_queue=max_queue),
        )
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .node("len", fn="testops:length", inputs={"text": "up.text"})
        .node("dbl", model="m", inputs={"x": "len.n"})
        .node("shape", fn="slow_ops:image_shape", inputs={"image": "inputs.image"})
        .node("dblx", model="m", inputs={"x": "inputs.x"})
        .output("upper", "up.text")
        .output("n2", "dbl.y")
        .output("image_shape", "shape.shape")
        .output("x2", "dblx.y")
        .limits(max_image_pixels=max_pixels)
        .build()
    )


def png(w: int = 8, h: int = 6) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def truncated_png() -> bytes:
    noise = np.random.default_rng(0).integers(0, 255, (50, 50, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = create_app(tiny_graph(), backends={"m": doubler()}, max_body_mb=0.25)
    with TestClient(app) as c:
        yield c


# -- /v1 ---------------------------------------------------------------------------------------
def test_v1_json_text_returns_the_usg_run_json_keys_and_a_request_id(client: TestClient) -> None:
    r = client.post("/v1/infer", json={"inputs": {"text": "abc"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"outputs", "pruned_nodes", "node_ms", "integrity", "request_id"}
    assert body["outputs"] == {"upper": "ABC", "n2": [[6.0]]}
    assert body["pruned_nodes"] == ["shape", "dblx"]
    assert r.headers["x-request-id"] == body["request_id"]


def test_request_ids_are_uuid4_hex_and_a_client_id_is_kept(client: TestClient) -> None:
    from usg.serve.context import new_request_id

    ids = {new_request_id() for _ in range(2000)}
    assert len(ids) == 2000
    for rid in ids:
        u = uuid.UUID(hex=rid)
        assert u.hex == rid and u.version == 4 and u.variant == uuid.RFC_4122
    r = client.post("/v1/infer", json={"inputs": {"text": "abc"}})
    assert uuid.UUID(hex=r.json()["request_id"]).version == 4
    r = client.post("/v1/infer", json={"inputs": {"text": "abc"}}, headers={"x-request-id": "mine-1"})
    assert r.json()["request_id"] == r.headers["x-request-id"] == "mine-1"


def test_v1_json_matches_the_executor_result_exactly() -> None:
    graph = tiny_graph()
    with Executor(graph, backends={"m": doubler()}) as ex:
        direct = ex.infer_sync({"text": "hello", "image": png()}).to_json_dict()
    with TestClient(create_app(graph, backends={"m": doubler()})) as c:
        body = c.post(
            "/v1/infer",
            json={"inputs": {"text": "hello", "image": {"b64": base64.b64encode(png()).decode()}}},
        ).json()
    assert body["outputs"] == direct["outputs"]
    assert body["pruned_nodes"] == direct["pruned_nodes"]
    assert set(body["node_ms"]) == set(direct["node_ms"])


def test_v1_multipart_image_file_and_text_field(client: TestClient) -> None:
    r = client.post("/v1/infer", files={"image": ("p.png", png(8, 6), "image/png")}, data={"text": "hi"})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["image_shape"] == [6, 8, 3]
    assert r.json()["outputs"]["upper"] == "HI"


def test_v1_json_tensor_and_data_url_image(client: TestClient) -> None:
    url = "data:image/png;base64," + base64.b64encode(png(3, 2)).decode()
    r = client.post("/v1/infer", json={"inputs": {"x": [[1.0, 2.0]], "image": url}})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["x2"] == [[2.0, 4.0]]
    assert r.json()["outputs"]["image_shape"] == [2, 3, 3]


@pytest.mark.parametrize(
    ("kwargs", "status", "field", "match"),
    [
        ({"json": {"inputs": {"img": "x"}}}, 400, "img", "unknown input"),
        ({"json": {"inputs": {"image": {"b64": "@@not base64@@"}}}}, 400, "image", "not valid base64"),
        (
            {"json": {"inputs": {"image": {"b64": base64.b64encode(b"GIF? no").decode()}}}},
            400,
            "image",
            "not a decodable image",
        ),
        (
            {"json": {"inputs": {"image": {"b64": base64.b64encode(truncated_png()).decode()}}}},
            400,
            "image",
            "truncated or corrupt",
        ),
        ({"json": {"inputs": {"image": {"path": "/etc/passwd"}}}}, 400, "image", "base64"),
        ({"json": {"inputs": {"text": 5}}}, 400, "text", "must be a string"),
        ({"json": {"inputs": {}}}, 400, None, "no inputs given"),
        ({"json": {"text": "forgot the wrapper"}}, 400, "inputs", '"inputs" object'),
        (
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "body",
            "not valid JSON",
        ),
        (
            {"content": b"text=hi", "headers": {"content-type": "text/plain"}},
            400,
            "content-type",
            "not supported",
        ),
        (
            {
                "content": b'--x\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\nabc',
                "headers": {"content-type": "multipart/form-data; boundary=x"},
            },
            400,
            "body",
            "ends before its closing boundary '--x--'",
        ),
        (
            {
                "content": b'--x\r\nContent-Disposition: form-data; name="text"\r\n\r\nhi\r\n--x--\r\nepilogue',
                "headers": {"content-type": 'multipart/form-data; boundary="x"'},
            },
            200,
            None,
            "",
        ),
        ({"json": {"inputs": {"x": [[1.0, 2.0, 3.0]], "text": "a"}}}, 200, None, ""),
        ({"json": {"inputs": {"x": [1.0, 2.0]}}}, 400, "x", "does not match"),
        (
            {"json": {"inputs": {"image": {"b64": base64.b64encode(png(200, 100)).decode()}}}},
            413,
            "image",
            "above the limit of 10000",
        ),
    ],
)
def test_v1_bad_inputs_name_the_field_and_the_fix(
    client: TestClient, kwargs: dict[str, Any], status: int, field: str | None, match: str
) -> None:
    r = client.post("/v1/infer", **kwargs)
    assert r.status_code == status, r.text
    if status != 200:
        body = r.json()
        assert match in body["message"]
        assert body.get("field") == field
        assert body.get("fix") or "fix:" in body["message"]


def test_v1_missing_required_input_is_400() -> None:
    graph = (
        GraphBuilder("req")
        .input("text", "text")
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .output("u", "up.text")
        .build()
    )
    with TestClient(create_app(graph)) as c:
        r = c.post("/v1/infer", files={"other": ("a.txt", b"x")})
        assert r.status_code == 400
        r = c.post("/v1/infer", data={"nothing": "x"})
        assert r.status_code == 400 and r.json()["field"] == "nothing"


def test_v1_body_limit_by_content_length_and_while_streaming(client: TestClient) -> None:
    big = b"x" * (300 * 1024)
    r = client.post("/v1/infer", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large" and "--max-body-mb" in r.json()["fix"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        for _ in range(10):
            yield b"y" * (64 * 1024)

    r = client.post("/v1/infer", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    metrics = client.get("/metrics").text
    assert 'usg_rejected_requests_total{reason="too_large"} 2.0' in metrics


# -- /v2 ---------------------------------------------------------------------------------------
def test_v2_health_metadata_and_ready(client: TestClient) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").json() == {"ready": True, "state": "ready"}
    assert client.get("/v2").json()["extensions"] == ["binary_tensor_data", "generate"]
    meta = client.get("/v2/models/tiny").json()
    assert {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]} == {
        "text": ("BYTES", [1]),
        "image": ("BYTES", [1]),
        "x": ("FP32", [1, -1]),
    }
    assert [o["name"] for o in meta["outputs"]] == ["upper", "n2", "image_shape", "x2"]
    assert client.get("/v2/models/tiny/ready").status_code == 200
    r = client.get("/v2/models/nope")
    assert r.status_code == 404 and "tiny" in r.json()["error"]


def test_v2_json_tensors(client: TestClient) -> None:
    req = {
        "id": "abc",
        "inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hey"]},
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]},
        ],
    }
    r = client.post("/v2/models/tiny/infer", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == "abc" and body["model_name"] == "tiny"
    outs = {o["name"]: o for o in body["outputs"]}
    assert outs["upper"] == {"name": "upper", "datatype": "BYTES", "shape": [1], "data": ["HEY"]}
    assert outs["x2"] == {"name": "x2", "datatype": "FP32", "shape": [1, 2], "data": [3.0, 5.0]}
    assert body["parameters"]["pruned_nodes"] == "shape"


def test_v2_binary_request_and_binary_response(client: TestClient) -> None:
    pytest.importorskip("tritonclient.http", reason="needs the triton extra: pip install 'usg[triton]'")
    from tritonclient.http import InferResult

    image = png(5, 4)
    text_bin = encode_bytes_elements([b"bin"])
    image_bin = encode_bytes_elements([image])
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(text_bin)},
                },
                {
                    "name": "image",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(image_bin)},
                },
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    r = client.post(
        "/v2/models/tiny/infer",
        content=head + text_bin + image_bin,
        headers={
            "Inference-Header-Content-Length": str(len(head)),
            "content-type": "application/octet-stream",
        },
    )
    assert r.status_code == 200, r.text
    hlen = int(r.headers["inference-header-content-length"])
    result = InferResult.from_response_body(r.content, header_length=hlen)
    assert result.as_numpy("upper").tolist() == [b"BIN"]
    np.testing.assert_array_equal(result.as_numpy("image_shape"), [4, 5, 3])
    np.testing.assert_array_equal(result.as_numpy("n2"), [[6.0]])


@pytest.mark.parametrize(
    ("req", "field", "match"),
    [
        (
            {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0]}]},
            "x",
            "needs 3 elements but 2",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]},
            "x",
            "datatype INT64 does not match",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]},
            "x",
            "does not match",
        ),
        (
            {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1]}]},
            "text",
            "expects BYTES",
        ),
        (
            {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]},
            "text",
            "expected 1 BYTES element",
        ),
        (
            {"inputs": [{"name": "nope", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
            "nope",
            "unknown input",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1]}]},
            "x",
            "unknown datatype",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "text",
                        "shape": [1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": 99},
                    }
                ]
            },
            "text",
            "runs past",
        ),
        ({"inputs": "text"}, "inputs", 'no "inputs" list'),
        (
            {
                "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                "outputs": [{"name": "zzz"}],
            },
            "outputs",
            "requested output 'zzz'",
        ),
    ],
)
def test_v2_bad_requests_are_400_with_a_message_tritonclient_can_read(
    client: TestClient, req: dict[str, Any], field: str, match: str
) -> None:
    r = client.post("/v2/models/tiny/infer", json=req)
    assert r.status_code == 400, r.text
    body = r.json()
    assert isinstance(body["error"], str) and match in body["error"]
    assert body["code"] == "bad_input" and body["field"] == field


def test_v2_bad_header_length_and_malformed_bytes(client: TestClient) -> None:
    r = client.post("/v2/models/tiny/infer", content=b"{}", headers={"Inference-Header-Content-Length": "50"})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in r.json()["error"]
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]}
    ).encode()
    body = head + (100).to_bytes(4, "little") + b"ab"
    r = client.post("/v2/models/tiny/infer", content=body, headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "declares 100 bytes" in r.json()["error"]


# -- capacity, timeouts, draining --------------------------------------------------------------
def test_over_capacity_is_429_with_retry_after_and_counted() -> None:
    app = create_app(tiny_graph(), backends={"m": doubler(delay=0.3)}, max_inflight=2)

    async def scenario() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                reqs = [c.post("/v1/infer", json={"inputs": {"text": f"t{i}"}}) for i in range(6)]
                responses = await asyncio.gather(*reqs)
                metrics = (await c.get("/metrics")).text
        assert 'usg_rejected_requests_total{reason="overloaded"} 4.0' in metrics
        return list(responses)

    responses = asyncio.run(scenario())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 200, 429, 429, 429, 429]
    rejected = next(r for r in responses if r.status_code == 429)
    assert rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"] == "overloaded" and "--max-inflight" in rejected.json()["message"]


def test_full_model_queue_is_429() -> None:
    app = create_app(tiny_graph(max_queue=1), backends={"m": doubler(delay=0.2)}, max_inflight=50)

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as c,
        ):
            reqs = [c.post("/v1/infer", json={"inputs": {"x": [[float(i)]]}}) for i in range(12)]
            return [r.status_code for r in await asyncio.gather(*reqs)]

    codes = asyncio.run(scenario())
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}


def test_request_timeout_is_504() -> None:
    app = create_app(tiny_graph(), backends={"m": doubler(delay=0.5)}, timeout_s=0.1)
    with TestClient(app) as c:
        r = c.post("/v1/infer", json={"inputs": {"x": [[1.0]]}})
        assert r.status_code == 504 and r.json()["error"] == "timeout"
        assert 'usg_rejected_requests_total{reason="timeout"} 1.0' in c.get("/metrics").text


def test_draining_turns_not_ready_and_refuses_new_requests(client: TestClient) -> None:
    ctx = client.app.state.usg  # type: ignore[attr-defined]
    ctx.begin_draining()
    assert ctx.state is ServeState.DRAINING
    assert client.get("/v2/health/ready").status_code == 503
    assert client.get("/v2/models/tiny/ready").json()["ready"] is False
    r = client.post("/v1/infer", json={"inputs": {"text": "late"}})
    assert r.status_code == 503 and r.json()["error"] == "draining"
    assert 'usg_rejected_requests_total{reason="draining"} 1.0' in client.get("/metrics").text


def test_shutdown_waits_for_inflight_requests_then_closes_the_executor() -> None:
    """The app's lifespan shutdown (what uvicorn runs on SIGTERM) waits for the request in flight,
    then closes the executor.

    Driven in one event loop, through the app's own lifespan and an ASGI transport: under a
    TestClient the request would come from another thread through the client's portal, which
    leaving the client stops as soon as the app has answered; a loaded machine then ran that
    thread's read of the answer after the portal stopped ("This portal is not running")."""
    app = create_app(tiny_graph(), backends={"m": doubler(delay=0.3)})
    ctx = app.state.usg
    in_flight_at_close: list[int] = []  # requests in flight when the shutdown closed the executor
    close = ctx.executor.aclose

    async def recorded_close() -> None:
        in_flight_at_close.append(ctx.gate.inflight)
        await close()

    ctx.executor.aclose = recorded_close

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://usg") as client:
            async with app.router.lifespan_context(app):
                request = asyncio.create_task(client.post("/v1/infer", json={"inputs": {"x": [[1.0]]}}))
                deadline = time.monotonic() + 60
                while ctx.gate.inflight == 0 and not request.done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert ctx.gate.inflight == 1 or request.done(), "the request never reached the server"
            # leaving the lifespan ran its shutdown; it waited for the request
            assert ctx.state is ServeState.STOPPED
            return await asyncio.wait_for(request, 30)

    response = asyncio.run(go())
    assert response.status_code == 200, response.text
    assert response.json()["outputs"]["x2"] == [[2.0]]
    assert in_flight_at_close == [0] and ctx.executor.state.value == "closed"


def test_create_app_accepts_a_new_executor_and_refuses_a_started_one() -> None:
    graph = tiny_graph()
    ex = Executor(graph, backends={"m": doubler()})
    app = create_app(graph, executor=ex)
    with TestClient(app) as c:
        assert c.post("/v1/infer", json={"inputs": {"text": "a"}}).status_code == 200
    from usg.errors import StateError

    with pytest.raises(StateError, match="needs a new executor"):
        create_app(graph, executor=ex)


def test_v2_json_image_is_base64_and_uint8_pixels_work(client: TestClient) -> None:
    b64 = base64.b64encode(png(7, 3)).decode()
    req = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [b64]}]}
    r = client.post("/v2/models/tiny/infer", json=req)
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]}["image_shape"] == [3, 7, 3]
    pixels = np.zeros((1, 2, 4, 3), np.uint8)
    req = {"inputs": [{"name": "image", "shape": [1, 2, 4, 3], "datatype": "UINT8", "data": pixels.ravel().tolist()}]}
    r = client.post("/v2/models/tiny/infer", json=req)
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]}["image_shape"] == [2, 4, 3]


def test_serve_command_help_lists_the_options() -> None:
    from click.testing import CliRunner

    from usg.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for opt in ("--host", "--port", "--max-inflight", "--max-body-mb", "--timeout", "--otel"):
        assert opt in result.output
    for opt in ("--header-timeout", "--body-timeout", "--keepalive-timeout", "--api-key-env", "--cpu-slots"):
        assert opt in result.output


def test_serve_refuses_embedded_only_options_with_the_ray_engine(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from usg.cli import cli

    graph = tmp_path / "g.yaml"
    graph.write_text("name: g\n")
    for args in (["--api-key-env", "K"], ["--body-timeout", "3"], ["--cpu-slots", "0"]):
        result = CliRunner().invoke(cli, ["serve", str(graph), "--engine", "ray", *args])
        assert result.exit_code != 0
        assert "applies to the embedded engine only" in str(result.exception)


@pytest.mark.parametrize(("cpu_slots", "slots"), [(None, "usable"), (0, 0), (1, 1)])
def test_create_app_sets_the_cpu_gate_and_metrics_show_it(cpu_slots: int | None, slots: int | str) -> None:
    """``usg serve --cpu-slots N`` (0: the gate off); by default one slot per usable core."""
    from usg.runtime.cpu_gate import usable_cores

    want = usable_cores() if slots == "usable" else slots
    app = create_app(tiny_graph(), backends={"m": doubler()}, cpu_slots=cpu_slots)
    with TestClient(app) as c:
        assert app.state.usg.executor.cpu_gate.slots == want
        assert f"usg_cpu_gate_slots {float(want)}" in c.get("/metrics").text
