"""Hardening pieces on their own: bounded JSON, error bodies per protocol, image and text limits,
the det pre-processing plan, the API key, the receive budget."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra (pip install 'usg[serve]') is not installed")

from PIL import Image
from starlette.testclient import TestClient
from test_serve_app import doubler, tiny_graph

from usg.errors import BackendError, InputError, Overloaded, PayloadTooLarge
from usg.ops.image import ImageLimits, decode_image
from usg.runtime.inputs import graph_limit, normalize_inputs
from usg.serve import ServeConfig, create_app
from usg.serve.decode import check_depth, load_json, safe_text
from usg.serve.errors import v1_error, v2_error
from usg.serve.limits import BodyBudget, RequestLimits


def test_load_json_bounds_depth_and_integer_digits() -> None:
    assert load_json(b'{"a": [[1]]}', max_depth=3, fix="f") == {"a": [[1]]}
    with pytest.raises(PayloadTooLarge, match="nests deeper than the limit of 2 levels"):
        load_json(b'{"a": [[1]]}', max_depth=2, fix="f")
    with pytest.raises(PayloadTooLarge, match="limit of 32"):
        load_json(b"[" * 5000 + b"]" * 5000, max_depth=32, fix="f")  # RecursionError inside the parser
    with pytest.raises(InputError, match="has 5000 digits, above the limit of 20"):
        load_json(b"[" + b"9" * 5000 + b"]", max_depth=32, fix="f")
    with pytest.raises(InputError, match="is not valid JSON"):
        load_json(b"{", max_depth=32, fix="f")


def test_load_json_decodes_bytes_and_text_as_json_loads_does() -> None:
    # one decoder built at import (session 15): bytes in any JSON encoding, a UTF-8 BOM only in bytes
    doc = {"inputs": {"text": "é ✓"}, "n": 12}
    for body in (json.dumps(doc).encode(), json.dumps(doc, ensure_ascii=False).encode("utf-16"), b"\xef\xbb\xbf{}"):
        assert load_json(body, max_depth=8, fix="f") == json.loads(body)
    assert load_json(json.dumps(doc), max_depth=8, fix="f") == doc  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"is not valid JSON .*BOM"):
        load_json("\ufeff{}", max_depth=8, fix="f")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="is not valid JSON"):
        load_json(b"\xff\xfe{", max_depth=8, fix="f")
    with pytest.raises(InputError, match="has 30 digits, above the limit of 20"):  # the bound holds on every call
        for _ in range(2):
            load_json(b"[" + b"1" * 30 + b"]", max_depth=8, fix="f")


def test_check_depth_is_iterative() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(10_000):  # deeper than the interpreter's recursion limit
        child: list[object] = []
        node.append(child)
        node = child
    with pytest.raises(PayloadTooLarge):
        check_depth(deep, 64)


def test_5xx_bodies_carry_no_library_paths_but_4xx_keep_their_message() -> None:
    exc = BackendError("model 'det' raised Fail: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:360 oom")
    for response, key in ((v1_error(exc, "r1"), "message"), (v2_error(exc, "r1"), "error")):
        body = json.loads(bytes(response.body))
        assert "/onnxruntime_src" not in body[key] and "bfc_arena" not in body[key]
        assert "<path>" in body[key] and "request id r1" in body[key]
    bad = InputError("text: bad", field="text", fix="send text")
    assert json.loads(bytes(v1_error(bad).body)) == {
        "error": "bad_input",
        "message": "text: bad",
        "field": "text",
        "fix": "send text",
    }
    assert json.loads(bytes(v2_error(bad).body))["error"] == "text: bad; fix: send text"


def test_error_bodies_encode_lone_surrogates_and_carry_retry_after() -> None:
    body = json.loads(bytes(v1_error(InputError("unknown input '\ud800'", field="\ud800")).body))
    assert body["field"] == "\\ud800"
    assert safe_text("a\udc80b") == "a\\udc80b"
    r = v2_error(Overloaded("full", retry_after=2.5))
    assert r.headers["retry-after"] == "3" and json.loads(bytes(r.body))["code"] == "overloaded"


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, format="PNG")
    return buf.getvalue()


def test_image_limits_aspect_ratio_and_formats() -> None:
    with pytest.raises(PayloadTooLarge, match=r"aspect ratio of 100:1.*limits.max_aspect_ratio"):
        decode_image(_png(1, 100))
    assert decode_image(_png(1, 100), limits=ImageLimits(max_aspect_ratio=200)).shape == (100, 1, 3)
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="PPM")
    with pytest.raises(InputError, match=r"allowed format \(PNG\)"):
        decode_image(_png(4, 4)[:0] + buf.getvalue(), limits=ImageLimits(formats=("PNG",)))
    assert decode_image(buf.getvalue(), limits=ImageLimits(formats=("PPM",))).shape == (4, 4, 3)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 4\n"
    with pytest.raises(InputError, match="not a decodable image"):
        decode_image(eps, limits=ImageLimits(formats=("EPS", "PNG")))  # EPS is never decoded


def test_truncated_images_are_input_errors() -> None:
    noise = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    for fmt in ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"):
        buf = io.BytesIO()
        Image.fromarray(noise).save(buf, format=fmt)
        with pytest.raises(InputError, match=r"truncated or corrupt|not a decodable image"):
            decode_image(buf.getvalue()[: len(buf.getvalue()) // 2])


def test_text_limits_and_surrogates() -> None:
    graph = tiny_graph()
    with pytest.raises(PayloadTooLarge, match=r"20001 characters.*limits.max_text_chars"):
        normalize_inputs(graph, {"text": "x" * 20_001})
    with pytest.raises(InputError, match=r"unpaired surrogate '\\ud800' at position 1"):
        normalize_inputs(graph, {"text": "a\ud800"})
    with pytest.raises(InputError, match="not valid UTF-8"):
        normalize_inputs(graph, {"text": b"\xff"})
    assert normalize_inputs(graph, {"text": "é" * 10})["text"] == "é" * 10


def test_graph_limit_reads_mappings_and_objects() -> None:
    class Limits:
        max_text_chars = 5

    assert graph_limit({"max_text_chars": 7}, "max_text_chars", 1) == 7
    assert graph_limit(Limits(), "max_text_chars", 1) == 5
    assert graph_limit(Limits(), "max_nesting_depth", 32) == 32
    assert RequestLimits.of({"max_body_bytes": 10}) == RequestLimits(max_body_bytes=10)
    assert RequestLimits.of({"max_body_bytes": 10}, max_body_bytes=99).max_body_bytes == 99


def test_det_plan_matches_det_preprocess_and_refuses_before_allocating() -> None:
    pytest.importorskip("cv2", reason="the ocr extra is not installed")
    pytest.importorskip("rapidocr_onnxruntime", reason="the ocr extra is not installed")
    from usg.ops.ocr import det_plan, det_preprocess

    for w, h in [(800, 1100), (2000, 40), (50, 1), (3, 3), (48, 32), (600, 6000)]:
        x = det_preprocess(np.zeros((h, w, 3), np.uint8))["x"]
        assert tuple(x.shape[2:]) == det_plan(h, w), (w, h)
    assert det_plan(10, 3000) is None  # RapidOCR would fail there (a side scaled to 0)
    with pytest.raises(PayloadTooLarge, match=r"to 736x34592 = 25459712 pixels.*options.max_pixels"):
        det_preprocess(np.zeros((50, 1, 3), np.uint8))
    with pytest.raises(PayloadTooLarge, match="a side would shrink to 0 px"):
        det_preprocess(np.zeros((10, 3000, 3), np.uint8))


def test_body_budget_refuses_past_its_capacity() -> None:
    budget = BodyBudget(100)
    budget.reserve(60)
    with pytest.raises(Overloaded, match="receiving 1 bodies"):
        budget.reserve(50)
    budget.release(60)
    budget.reserve(100)


def test_api_key_on_inference_and_metrics_not_on_health() -> None:
    app = create_app(tiny_graph(), backends={"m": doubler()}, config=ServeConfig(api_key="k3y"))
    with TestClient(app) as c:
        assert c.get("/v2/health/ready").status_code == 200
        r = c.post("/v1/infer", json={"inputs": {"text": "a"}})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        assert c.get("/metrics").status_code == 401
        assert c.get("/v2/models/tiny").status_code == 401
        ok = {"Authorization": "Bearer k3y"}
        assert c.post("/v1/infer", json={"inputs": {"text": "a"}}, headers=ok).json()["outputs"]["upper"] == "A"
        assert c.get("/metrics", headers=ok).status_code == 200


def test_a_wrong_method_or_path_names_the_fix() -> None:
    # were {"error": "method_not_allowed", "message": "Method Not Allowed: /v1/infer"} and "Not Found: ..."
    with TestClient(create_app(tiny_graph())) as c:
        r = c.get("/v1/infer")
        assert r.status_code == 405
        assert r.json()["message"] == "Method Not Allowed: /v1/infer" and r.json()["fix"] == "send /v1/infer as POST"
        r = c.post("/v1/infr", json={})
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert "use POST /v1/infer" in r.json()["fix"] and "GET /openapi.json" in r.json()["fix"]


def test_openapi_lists_the_graph_inputs() -> None:
    with TestClient(create_app(tiny_graph())) as c:
        doc = c.get("/openapi.json").json()
    props = doc["paths"]["/v1/infer"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(props["properties"]["inputs"]["properties"]) == {"text", "image", "x"}


def test_image_formats_per_input_from_the_graph_limits() -> None:
    from usg.graph import GraphBuilder

    graph = (
        GraphBuilder("fmt")
        .input("scan", "image", optional=True)
        .input("photo", "image", optional=True)
        .node("shape", fn="slow_ops:image_shape", inputs={"image": "inputs.scan"})
        .output("shape", "shape.shape")
        .limits(image_formats={"scan": ["PPM"]})
        .build()
    )
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="PPM")
    assert normalize_inputs(graph, {"scan": buf.getvalue()})["scan"].shape == (4, 4, 3)
    with pytest.raises(InputError, match=r"allowed format \(PNG, JPEG, WEBP, BMP, TIFF, GIF\)"):
        normalize_inputs(graph, {"photo": buf.getvalue()})  # the default list
    with pytest.raises(InputError, match=r"allowed format \(PPM\)"):
        normalize_inputs(graph, {"scan": _png(4, 4)})


def test_5xx_messages_keep_urls_and_api_routes_and_lose_file_paths() -> None:
    from usg.errors import BackendError
    from usg.serve.errors import public_message

    exc = BackendError(
        "node 'llm': engine http://127.0.0.1:8000/v1/chat/completions answered POST /v1/chat/completions "
        "with 500: cannot read /opt/models/llama/config.json (see https://example.com/docs/errors/x)"
    )
    msg = public_message(exc, "r7")
    assert "http://127.0.0.1:8000/v1/chat/completions" in msg
    assert "POST /v1/chat/completions" in msg
    assert "https://example.com/docs/errors/x" in msg
    assert "/opt/models" not in msg and "cannot read <path>" in msg
    assert public_message(BackendError("key at /v1/secret/key.pem"), "r8").startswith("key at <path>")
