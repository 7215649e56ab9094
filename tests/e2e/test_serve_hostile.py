"""Hostile input against a real ``usg serve`` of the document-OCR example (issue reproductions D1-D8).

Every refusal is a 4xx with a JSON body naming the field (and, for limits, the graph key that
raises it); the server stays healthy and answers a valid request afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest
from harness import ROOT, Server
from PIL import Image

SAMPLE = ROOT / "examples" / "document_ocr" / "sample.png"


def _png(w: int, h: int, color: int = 255) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (color, color, color)).save(buf, format="PNG")
    return buf.getvalue()


def _encoded(fmt: str) -> bytes:
    noise = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format=fmt)
    return buf.getvalue()


def _post_image(server: Server, data: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/infer", files={"image": ("x", data, "application/octet-stream")}, timeout=120)


def _post_raw(server: Server, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)


def _still_serves(server: Server) -> None:
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "total due"}}, timeout=60)
    assert r.status_code == 200 and len(r.json()["outputs"]["text_embedding"][0]) == 384


@pytest.mark.parametrize(
    ("w", "h", "key"),
    [
        (1, 50, "max_pixels"),  # det pre-processing would scale it to 736 x 34592
        (1, 2000, "max_aspect_ratio"),
        (4000, 1, "max_aspect_ratio"),
        (3000, 10, "max_aspect_ratio"),
        (10, 3000, "max_aspect_ratio"),
    ],
)
def test_d1_d2_thin_images_get_413_naming_the_limit_and_its_key(ocr_server: Server, w: int, h: int, key: str) -> None:
    r = _post_image(ocr_server, _png(w, h))
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["field"] == "image" and f"{w}x{h}" in body["message"]
    assert key in body["fix"]


def test_d1_thin_but_bounded_image_is_processed(ocr_server: Server) -> None:
    r = _post_image(ocr_server, _png(2000, 40))  # one text line's proportions: letterboxed, 2944 x 736
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["lines"] == []


@pytest.mark.slow
def test_d1_twenty_concurrent_thin_pngs_leave_rss_within_300_mb(ocr_server: Server) -> None:
    _still_serves(ocr_server)
    before = ocr_server.rss_kib()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as c:
            files = [{"image": ("t.png", _png(1, 50), "image/png")} for _ in range(20)]
            rs = await asyncio.gather(*(c.post(f"{ocr_server.url}/v1/infer", files=f) for f in files))
            return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [413] * 20
    assert ocr_server.rss_kib() - before < 300 * 1024, (before, ocr_server.rss_kib())
    _still_serves(ocr_server)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF", "PPM", "ICO"])
def test_d3_truncated_images_of_every_format_are_400(ocr_server: Server, fmt: str) -> None:
    data = _encoded(fmt)
    r = _post_image(ocr_server, data[: max(8, len(data) // 3)])
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "image"
    assert "truncated or corrupt" in r.json()["message"] or "not a decodable image" in r.json()["message"]


def test_d3_truncated_header_from_the_issue(ocr_server: Server) -> None:
    for b64 in ("iVBORw0KGgoAAAANSUhEUg==", "/9j/4AAQSkY="):
        r = httpx.post(f"{ocr_server.url}/v1/infer", json={"inputs": {"image": {"b64": b64}}}, timeout=30)
        assert r.status_code == 400 and r.json()["field"] == "image", r.text


def test_formats_outside_the_allow_list_are_not_decoded(ocr_server: Server) -> None:
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    for data in (eps, _encoded("PPM")):
        r = _post_image(ocr_server, data)
        assert r.status_code == 400, r.text
        assert "allowed format (PNG, JPEG, WEBP, BMP, TIFF, GIF)" in r.json()["message"]


def test_d4_deep_nesting_is_refused_before_recursing(ocr_server: Server) -> None:
    deep = b'{"inputs":{"text":' + b"[" * 1500 + b"]" * 1500 + b"}}"
    r = _post_raw(ocr_server, "/v1/infer", deep)
    assert r.status_code == 413, r.text
    assert "limits.max_nesting_depth" in r.json()["fix"]
    data = "[" * 990 + '"a"' + "]" * 990
    v2 = f'{{"inputs":[{{"name":"text","shape":[1],"datatype":"BYTES","data":{data}}}]}}'.encode()
    r = _post_raw(ocr_server, "/v2/models/document-ocr/infer", v2)
    assert r.status_code == 413 and "nests deeper" in r.json()["error"], r.text
    _still_serves(ocr_server)


def test_d5_huge_integers_are_400(ocr_server: Server) -> None:
    big = b"9" * 5000
    r = _post_raw(ocr_server, "/v1/infer", b'{"inputs":{"text":' + big + b"}}")
    assert r.status_code == 400 and "5000 digits" in r.json()["message"], r.text
    v2 = b'{"inputs":[{"name":"text","shape":[' + big + b'],"datatype":"BYTES","data":["a"]}]}'
    r = _post_raw(ocr_server, "/v2/models/document-ocr/infer", v2)
    assert r.status_code == 400 and "5000 digits" in r.json()["error"], r.text


_V2_SURROGATE = rb'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["\ud800"]}]}'
_JSON = {"content-type": "application/json"}


def test_d6_lone_surrogates_are_400_and_the_connection_stays_usable(ocr_server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", ocr_server.port, timeout=60)
    try:
        cases = [
            ("/v1/infer", rb'{"inputs":{"text":"\ud800"}}', "text"),
            ("/v1/infer", rb'{"inputs":{"\ud800":"x"}}', "\\ud800"),
            (
                "/v2/models/document-ocr/infer",
                _V2_SURROGATE,
                "text",
            ),
        ]
        for path, body, field in cases:
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            payload = json.loads(resp.read().decode("utf-8"))  # valid UTF-8 JSON
            assert resp.status == 400, payload
            assert payload["field"] == field
        conn.request(
            "POST", "/v1/infer", body=b'{"inputs":{"text":"ok"}}', headers={"content-type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200 and "text_embedding" in json.loads(resp.read())["outputs"]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ({"inputs": [{"name": "text", "shape": [1], "datatype": [], "data": ["a"]}]}, "text"),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}], "outputs": 5}, "outputs"),
        (
            {
                "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                "outputs": [{"name": "text_embedding", "parameters": 5}],
            },
            "outputs",
        ),
        ({"inputs": [{"name": "text", "shape": [1] * 65, "datatype": "FP32", "data": [1.0]}]}, "text"),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"], "parameters": 3}]}, "text"),
        ({"inputs": [{"name": "text", "shape": [True], "datatype": "BYTES", "data": ["a"]}]}, "text"),
        (
            {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}], "parameters": []},
            "parameters",
        ),
    ],
)
def test_d7_v2_fields_of_the_wrong_type_are_400_naming_the_field(
    ocr_server: Server, header: dict[str, Any], field: str
) -> None:
    r = httpx.post(f"{ocr_server.url}/v2/models/document-ocr/infer", json=header, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and r.json()["fix"]


def test_d8_huge_text_is_413_before_tokenizing(ocr_server: Server) -> None:
    text = "x" * 150_000
    r = httpx.post(f"{ocr_server.url}/v1/infer", json={"inputs": {"text": text}}, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["field"] == "text" and "limits.max_text_chars" in r.json()["fix"]
    r = httpx.post(f"{ocr_server.url}/v1/infer", files={"text": ("t.txt", ("字" * 150_000).encode(), "text/plain")})
    assert r.status_code == 413 and "450000 bytes" in r.json()["message"], r.text  # refused before decoding
    _still_serves(ocr_server)


def test_unknown_path_and_wrong_method_are_json(ocr_server: Server) -> None:
    r = httpx.get(f"{ocr_server.url}/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.get(f"{ocr_server.url}/v1/infer", timeout=10)
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    r = httpx.get(f"{ocr_server.url}/v2/models/document-ocr/nope", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_openapi_document_describes_v1(ocr_server: Server) -> None:
    doc = httpx.get(f"{ocr_server.url}/openapi.json", timeout=10).json()
    schema = doc["paths"]["/v1/infer"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["properties"]["inputs"]["properties"]) == {"image", "text"}
    assert doc["openapi"].startswith("3.")
    b64 = base64.b64encode(SAMPLE.read_bytes()).decode()
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate({"inputs": {"image": {"b64": b64}, "text": "x"}}, schema)
