"""A real ``usg serve --grpc-port`` of the document-OCR example, with tritonclient.grpc unmodified:
the same results as HTTP v2, metadata, errors with their status codes, streaming, and SIGTERM
draining both ports (on the model-free slow graph, whose requests take as long as they say)."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from harness import ROOT, Server, start_server
from procs import free_port

tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

SAMPLE = ROOT / "examples" / "document_ocr" / "sample.png"
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"
MODEL = "document-ocr"


@pytest.fixture(scope="module")
def ocr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Any]]:
    """One document-OCR server with HTTP and gRPC, and a tritonclient.grpc client of it."""
    grpc_port = free_port()
    server = start_server(GRAPH, "--grpc-port", str(grpc_port), "--max-body-mb", "4", tmp=tmp_path_factory.mktemp("g"))
    client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    yield server, client
    client.close()
    assert server.stop() == 0, server.output()


def bytes_input(name: str, *values: bytes) -> Any:
    t = tg.InferInput(name, [len(values)], "BYTES")
    t.set_data_from_numpy(np.array(values, dtype=object))
    return t


def http_v2(server: Server, **inputs: bytes) -> dict[str, Any]:
    """The HTTP v2 outputs by name (BYTES inputs as binary tensor data, JSON outputs)."""
    body = {
        "inputs": [
            {"name": k, "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 4 + len(v)}}
            for k, v in inputs.items()
        ]
    }
    head = json.dumps(body).encode()
    tail = b"".join(len(v).to_bytes(4, "little") + v for v in inputs.values())
    r = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        content=head + tail,
        headers={"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return {o["name"]: o for o in r.json()["outputs"]}


def test_text_in_fp32_embedding_out_equals_http(ocr: tuple[Server, Any]) -> None:
    server, client = ocr
    result = client.infer(MODEL, [bytes_input("text", b"invoice total")], client_timeout=60)
    emb = result.as_numpy("text_embedding")
    assert emb.dtype == np.float32 and emb.shape == (1, 384)
    assert result.as_numpy("lines") is None and result.as_numpy("ocr_embedding") is None  # pruned branch: absent
    ref = http_v2(server, text=b"invoice total")["text_embedding"]
    assert ref["shape"] == [1, 384] and ref["datatype"] == "FP32"
    np.testing.assert_allclose(emb.reshape(-1), ref["data"], atol=1e-6)
    v1 = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "invoice total"}}, timeout=60).json()
    np.testing.assert_allclose(emb, v1["outputs"]["text_embedding"], atol=1e-6)


def test_png_in_bytes_lines_out_equal_http(ocr: tuple[Server, Any]) -> None:
    server, client = ocr
    png = SAMPLE.read_bytes()
    wanted = [tg.InferRequestedOutput("lines"), tg.InferRequestedOutput("text_embedding")]
    result = client.infer(MODEL, [bytes_input("image", png)], outputs=wanted, client_timeout=60)
    lines = [json.loads(x) for x in result.as_numpy("lines")]
    assert "INVOICE" in lines[0]["text"] and set(lines[0]) == {"text", "score", "box"}
    assert result.as_numpy("text_embedding") is None  # requested, but its branch was pruned
    assert result.as_numpy("ocr_embedding") is None  # not requested
    ref = [json.loads(x) for x in http_v2(server, image=png)["lines"]["data"]]
    assert [ln["text"] for ln in lines] == [ln["text"] for ln in ref]
    assert [ln["box"] for ln in lines] == [ln["box"] for ln in ref]
    np.testing.assert_allclose([ln["score"] for ln in lines], [ln["score"] for ln in ref], atol=1e-5)


def test_health_and_metadata_match_http(ocr: tuple[Server, Any]) -> None:
    server, client = ocr
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL, as_json=True)
    ref = httpx.get(f"{server.url}/v2/models/{MODEL}", timeout=30).json()
    assert meta["name"] == ref["name"] and meta["versions"] == ref["versions"]
    for kind in ("inputs", "outputs"):
        got = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta[kind]]
        assert got == [(t["name"], t["datatype"], t["shape"]) for t in ref[kind]]
    assert client.get_server_metadata(as_json=True)["name"] == "usg"


def test_bad_input_is_invalid_argument_with_the_field_and_fix(ocr: tuple[Server, Any]) -> None:
    _, client = ocr
    cases = [
        (
            [bytes_input("image", b"definitely not a png")],
            "StatusCode.INVALID_ARGUMENT",
            r"image.*not a decodable image",
        ),
        ([bytes_input("imgae", b"x")], "StatusCode.INVALID_ARGUMENT", r"unknown input 'imgae'.*fix: use .*image, text"),
        ([bytes_input("text", b"a", b"b")], "StatusCode.INVALID_ARGUMENT", r"text: expected 1 BYTES.*fix: send text"),
        ([bytes_input("text", b"x" * (5 * 2**20))], "StatusCode.RESOURCE_EXHAUSTED", "larger than max"),
    ]
    for inputs, status, match in cases:
        with pytest.raises(InferenceServerException, match=match) as info:
            client.infer(MODEL, inputs, client_timeout=60)
        assert info.value.status() == status
    with pytest.raises(InferenceServerException, match="model 'other' version '' is not served") as info:
        client.infer("other", [bytes_input("text", b"a")], client_timeout=60)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert client.infer(MODEL, [bytes_input("text", b"still fine")]).as_numpy("text_embedding").shape == (1, 384)


def test_stream_answers_each_message(ocr: tuple[Server, Any]) -> None:
    _, client = ocr
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)), stream_timeout=120)
    try:
        client.async_stream_infer(MODEL, [bytes_input("image", SAMPLE.read_bytes())], request_id="doc")
        client.async_stream_infer(MODEL, [bytes_input("text", b"total due")], request_id="q")
        client.async_stream_infer(MODEL, [bytes_input("image", b"not an image")], request_id="bad")
        got = [replies.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
    ok = {r.get_response().id: r for r, e in got if e is None}
    errors = [str(e) for r, e in got if e is not None]
    assert set(ok) == {"doc", "q"}
    assert "INVOICE" in json.loads(ok["doc"].as_numpy("lines")[0])["text"]
    assert ok["q"].as_numpy("text_embedding").shape == (1, 384)
    assert len(errors) == 1 and errors[0].startswith("INVALID_ARGUMENT: image") and "fix:" in errors[0]


def test_sigterm_drains_both_ports(serve: Callable[..., Server], slow_graph: Path) -> None:
    grpc_port = free_port()
    server = serve(slow_graph, "--grpc-port", str(grpc_port), "--max-inflight", "8")
    client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    results: dict[str, Any] = {}

    def unary() -> None:
        results["grpc"] = client.infer("slow", [bytes_input("text", b"sleep:3 grpc")], client_timeout=60)

    def http() -> None:
        results["http"] = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "sleep:3 http"}}, timeout=60)

    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)), stream_timeout=60)
    threads = [threading.Thread(target=unary), threading.Thread(target=http)]
    for t in threads:
        t.start()
    client.async_stream_infer("slow", [bytes_input("text", b"sleep:3 stream")], request_id="inflight")
    deadline = time.monotonic() + 10
    while "usg_inflight_requests 3.0" not in httpx.get(f"{server.url}/metrics", timeout=5).text:
        assert time.monotonic() < deadline, "the three slow requests never were in flight together"
        time.sleep(0.05)

    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(InferenceServerException, match="shutting down and accepts no new requests") as info:
        client.infer("slow", [bytes_input("text", b"late")], client_timeout=10)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    client.async_stream_infer("slow", [bytes_input("text", b"late")], request_id="late")
    late_result, late_error = replies.get(timeout=10)
    assert late_result is None and str(late_error).startswith("UNAVAILABLE: the server is shutting down")
    try:  # HTTP takes no new request either: its listener is closed, or it answers 503 while draining
        late_http = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "late"}}, timeout=5)
        assert late_http.status_code == 503, late_http.text
    except httpx.ConnectError:
        pass

    for t in threads:
        t.join(timeout=30)
    streamed, error = replies.get(timeout=30)
    assert error is None and streamed.as_numpy("echo").tolist() == [b"sleep:3 stream"]
    assert results["grpc"].as_numpy("echo").tolist() == [b"sleep:3 grpc"]
    assert results["http"].status_code == 200 and results["http"].json()["outputs"]["echo"] == "sleep:3 http"
    client.stop_stream()
    client.close()
    assert server.proc.wait(timeout=30) == 0, server.output()


def _serve_has_api_key_option() -> bool:
    from usg.cli.serve_cmd import serve

    return any(p.name == "api_key_env" for p in serve.params)


@pytest.mark.skipif(not _serve_has_api_key_option(), reason="needs usg serve --api-key-env (issue #14 item 8)")
def test_api_key_guards_grpc_inference_not_health(tmp_path: Path, slow_graph: Path) -> None:
    grpc_port = free_port()
    env = {**os.environ, "USG_TEST_KEY": "s3cret-key"}
    server = start_server(
        slow_graph, "--api-key-env", "USG_TEST_KEY", "--grpc-port", str(grpc_port), tmp=tmp_path, env=env
    )
    client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("slow")
        for headers, match in ((None, "no authorization metadata"), ({"authorization": "Bearer nope"}, "API key")):
            with pytest.raises(InferenceServerException, match=match) as info:
                client.infer("slow", [bytes_input("text", b"x")], headers=headers, client_timeout=30)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        ok = client.infer("slow", [bytes_input("text", b"x")], headers={"authorization": "Bearer s3cret-key"})
        assert ok.as_numpy("echo").tolist() == [b"x"]
    finally:
        client.close()
        assert server.stop() == 0, server.output()
