"""Fuzzing a real ``usg serve`` (the document-OCR example) with hypothesis.

Properties, for arbitrary bodies on ``/v1/infer`` and ``/v2/models/document-ocr/infer``:
never a 5xx, every error is a JSON body with ``error``; afterwards health is 200 and a valid
request is answered correctly. Bounded for CI (about a minute on 2 cores); set
``USG_FUZZ_EXAMPLES`` to run more examples per property.
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import Any

import httpx
import pytest
from harness import ROOT, Server

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("USG_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SAMPLE = ROOT / "examples" / "document_ocr" / "sample.png"

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30,
)
names = st.one_of(st.sampled_from(["image", "text", "imgae", ""]), st.text(max_size=8))


def _png_prefix(n: int) -> str:
    data = SAMPLE.read_bytes()
    return base64.b64encode(data[: max(1, n)]).decode()


image_values = st.one_of(
    json_values,
    st.builds(lambda n: {"b64": _png_prefix(n)}, st.integers(1, 600)),
    st.builds(lambda b: {"b64": base64.b64encode(b).decode()}, st.binary(max_size=200)),
    st.text(max_size=60),
)
v1_bodies = st.one_of(
    st.fixed_dictionaries({"inputs": st.dictionaries(names, st.one_of(json_values, image_values), max_size=3)}),
    st.fixed_dictionaries({"inputs": st.fixed_dictionaries({"image": image_values})}),
    json_values,
)
tensor_entries = st.fixed_dictionaries(
    {
        "name": st.one_of(st.sampled_from(["text", "image"]), json_values),
        "shape": st.one_of(st.lists(st.integers(-2, 2**40), max_size=5), json_values),
        "datatype": st.one_of(st.sampled_from(["BYTES", "FP32", "UINT8", "INT64", "BOOL", "FP16"]), json_values),
        "data": json_values,
    },
    optional={
        "parameters": st.one_of(st.dictionaries(st.sampled_from(["binary_data_size"]), json_values), json_values)
    },
)
v2_bodies = st.one_of(
    st.fixed_dictionaries(
        {"inputs": st.lists(tensor_entries, max_size=3)},
        optional={
            "outputs": st.one_of(
                json_values, st.lists(st.dictionaries(st.sampled_from(["name", "parameters"]), json_values))
            ),
            "parameters": json_values,
            "id": json_values,
        },
    ),
    json_values,
)


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        body = r.json()
        assert isinstance(body, dict) and body.get("error"), r.text


@pytest.fixture(scope="module")
def client(ocr_server: Server) -> Any:
    with httpx.Client(base_url=ocr_server.url, timeout=120) as c:
        yield c
    _answers_correctly_afterwards(ocr_server)


def _answers_correctly_afterwards(server: Server) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    r = httpx.post(
        f"{server.url}/v1/infer",
        files={"image": ("s.png", SAMPLE.read_bytes(), "image/png")},
        data={"text": "invoice total"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert "INVOICE" in r.json()["outputs"]["lines"][0]["text"]


@FUZZ
@given(body=v1_bodies)
def test_fuzz_v1_json(client: httpx.Client, body: Any) -> None:
    _check(client.post("/v1/infer", content=json.dumps(body).encode(), headers={"content-type": "application/json"}))


@FUZZ
@given(raw=st.binary(max_size=300), media=st.sampled_from(["application/json", "multipart/form-data; boundary=x", ""]))
def test_fuzz_v1_raw_bytes(client: httpx.Client, raw: bytes, media: str) -> None:
    _check(client.post("/v1/infer", content=raw, headers={"content-type": media}))


@FUZZ
@given(image=st.binary(max_size=400), text=st.one_of(st.none(), st.text(max_size=50)), cut=st.integers(1, 2000))
def test_fuzz_v1_multipart(client: httpx.Client, image: bytes, text: str | None, cut: int) -> None:
    data = {"text": text} if text else None
    files = {"image": ("x.png", SAMPLE.read_bytes()[:cut] + image, "image/png")}
    _check(client.post("/v1/infer", files=files, data=data))


@FUZZ
@given(body=v2_bodies)
def test_fuzz_v2_json(client: httpx.Client, body: Any) -> None:
    _check(
        client.post(
            "/v2/models/document-ocr/infer",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
    )


@FUZZ
@given(
    head=v2_bodies,
    tail=st.binary(max_size=64),
    length=st.one_of(st.none(), st.integers(-5, 400).map(str), st.text("0123456789abc-+", min_size=1, max_size=5)),
)
def test_fuzz_v2_binary(client: httpx.Client, head: Any, tail: bytes, length: str | None) -> None:
    header = json.dumps(head).encode()
    headers = {"content-type": "application/octet-stream"}
    if length is not None:
        headers["inference-header-content-length"] = length
    _check(client.post("/v2/models/document-ocr/infer", content=header + tail, headers=headers))


def test_fuzz_images_of_odd_sizes(client: httpx.Client) -> None:
    from PIL import Image

    for w, h in [(1, 1), (1, 30), (7, 3000), (2000, 2), (31, 33), (5000, 100), (1, 799)]:
        buf = io.BytesIO()
        Image.new("L", (w, h), 128).save(buf, format="PNG")
        _check(client.post("/v1/infer", files={"image": ("x.png", buf.getvalue(), "image/png")}))
