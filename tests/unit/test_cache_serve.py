"""Integrity and cache metrics over HTTP (fake backends): digests in v1/v2 responses, a client's
expected digest checked (400 naming both), usg_cache_* series on /metrics."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator

import pytest
from PIL import Image

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from usg.graph import GraphBuilder
from usg.serve import create_app
from usg.specs import TensorSpec
from usg.testing import FakeBackend


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def client() -> Iterator[TestClient]:
    graph = (
        GraphBuilder("cached")
        .input("text", "text", optional=True)
        .input("image", "image", optional=True)
        .model("m", "python", options={"callable": "testops:identity"})
        .node("len", fn="testops:length", inputs={"text": "inputs.text"})
        .node("dbl", model="m", inputs={"x": "len.n"}, cache=True)
        .node("raw", fn="testops:raw_image", inputs={"image": "inputs.image"})
        .output("n2", "dbl.y")
        .output("pixels", "raw.hwc")
        .build()
    )
    spec = TensorSpec("float32", ("batch", None))
    fake = FakeBackend(lambda inp: {"y": inp["x"] * 2}, {"x": spec}, {"y": spec})
    with TestClient(create_app(graph, backends={"m": fake})) as c:
        yield c


def test_v1_response_carries_the_digest_of_each_input_as_received(client: TestClient) -> None:
    data = png()
    r = client.post("/v1/infer", json={"inputs": {"text": "abc", "image": {"b64": base64.b64encode(data).decode()}}})
    assert r.status_code == 200, r.text
    assert r.json()["integrity"] == {
        "text": "sha256:" + hashlib.sha256(b"abc").hexdigest(),
        "image": "sha256:" + hashlib.sha256(data).hexdigest(),
    }


def test_v1_expected_sha256_mismatch_is_a_400_naming_the_input_and_both_digests(client: TestClient) -> None:
    data = png()
    good = hashlib.sha256(data).hexdigest()
    image = {"b64": base64.b64encode(data).decode(), "sha256": good}
    assert client.post("/v1/infer", json={"inputs": {"image": image}}).status_code == 200
    bad = hashlib.sha256(b"something else").hexdigest()
    r = client.post("/v1/infer", json={"inputs": {"image": {**image, "sha256": bad}}})
    assert r.status_code == 400, r.text
    assert "'image'" in r.text and good in r.text and bad in r.text


def test_v2_parameters_carry_integrity_and_an_input_parameter_is_checked(client: TestClient) -> None:
    digest = hashlib.sha256(b"hey").hexdigest()
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hey"]}
    r = client.post("/v2/models/cached/infer", json={"inputs": [tensor]})
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["integrity"] == f"text=sha256:{digest}"
    wrong = {**tensor, "parameters": {"sha256": "0" * 64}}
    r = client.post("/v2/models/cached/infer", json={"inputs": [wrong]})
    assert r.status_code == 400 and digest in r.text


def test_metrics_expose_cache_hits_and_misses(client: TestClient) -> None:
    for _ in range(2):
        assert client.post("/v1/infer", json={"inputs": {"text": "abc"}}).status_code == 200
    text = client.get("/metrics").text
    assert 'usg_cache_lookups_total{node="dbl",outcome="hit"} 1.0' in text
    assert 'usg_cache_lookups_total{node="dbl",outcome="miss"} 1.0' in text
    assert 'usg_cache_hit_seconds_count{node="dbl"} 1.0' in text
    assert 'usg_cache_bytes{store="memory"}' in text


def test_multipart_part_digest_headers_are_checked(client: TestClient) -> None:
    data = png()
    good = hashlib.sha256(data).digest()
    boundary = "usgtestboundary"

    def body(part_headers: str) -> bytes:
        return (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="p.png"\r\n'
                f"Content-Type: image/png\r\n{part_headers}\r\n"
            ).encode()
            + data
            + f"\r\n--{boundary}--\r\n".encode()
        )

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    ok = client.post("/v1/infer", content=body(f"X-Content-SHA256: {good.hex()}\r\n"), headers=headers)
    assert ok.status_code == 200, ok.text
    rfc = f"Content-Digest: sha-256=:{base64.b64encode(good).decode()}:\r\n"
    assert client.post("/v1/infer", content=body(rfc), headers=headers).status_code == 200
    wrong = hashlib.sha256(b"other").hexdigest()
    r = client.post("/v1/infer", content=body(f"X-Content-SHA256: {wrong}\r\n"), headers=headers)
    assert r.status_code == 400 and wrong in r.text and good.hex() in r.text, r.text


def test_the_access_log_line_names_the_request_and_its_input_digests(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="usg.access"):
        r = client.post("/v1/infer", json={"inputs": {"text": "abc"}}, headers={"x-request-id": "rid-42"})
    assert r.status_code == 200
    (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "usg.access"]
    assert line.startswith("POST /v1/infer 200 ") and "rid=rid-42" in line
    assert "text=sha256:" + hashlib.sha256(b"abc").hexdigest() in line
