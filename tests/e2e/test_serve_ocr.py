"""A real ``usg serve`` of the document-OCR example, over HTTP: /v1, tritonclient (v2), errors, metrics."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess

import httpx
import numpy as np
import pytest
from harness import ROOT, USG, Server
from PIL import Image

SAMPLE = ROOT / "examples" / "document_ocr" / "sample.png"
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"


@pytest.fixture(scope="module")
def cli_json() -> dict[str, object]:
    env = {**os.environ, "USG_CACHE": os.environ.get("USG_CACHE", "/tmp/usgcache")}
    out = subprocess.run(
        [str(USG), "run", str(GRAPH), "-i", f"image={SAMPLE}", "-i", "text=invoice total", "--json"],
        capture_output=True,
        check=True,
        env=env,
        timeout=120,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_multipart_matches_usg_run_json(ocr_server: Server, cli_json: dict[str, object]) -> None:
    r = httpx.post(
        f"{ocr_server.url}/v1/infer",
        files={"image": ("sample.png", SAMPLE.read_bytes(), "image/png")},
        data={"text": "invoice total"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {*cli_json, "request_id"}
    outs, ref = body["outputs"], cli_json["outputs"]
    assert isinstance(ref, dict)
    assert set(outs) == set(ref) == {"lines", "ocr_embedding", "text_embedding", "relevance"}
    best = outs["relevance"]["best_line"]
    assert outs["relevance"] == ref["relevance"] and best["text"] == outs["lines"][best["index"]]["text"]
    assert [ln["text"] for ln in outs["lines"]] == [ln["text"] for ln in ref["lines"]]
    assert "INVOICE" in outs["lines"][0]["text"]
    np.testing.assert_allclose(outs["ocr_embedding"], ref["ocr_embedding"], atol=1e-5)
    np.testing.assert_allclose(outs["text_embedding"], ref["text_embedding"], atol=1e-5)
    assert body["pruned_nodes"] == cli_json["pruned_nodes"] == []


def test_json_base64_text_only_prunes_the_ocr_branch(ocr_server: Server) -> None:
    r = httpx.post(f"{ocr_server.url}/v1/infer", json={"inputs": {"text": "hello"}}, timeout=60)
    assert r.status_code == 200
    assert set(r.json()["outputs"]) == {"text_embedding"}
    assert "det" in r.json()["pruned_nodes"]
    b64 = base64.b64encode(SAMPLE.read_bytes()).decode()
    r = httpx.post(f"{ocr_server.url}/v1/infer", json={"inputs": {"image": {"b64": b64}}}, timeout=60)
    assert r.status_code == 200
    assert set(r.json()["outputs"]) == {"lines", "ocr_embedding"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning:geventhttpclient.*")  # third-party noise
@pytest.mark.filterwarnings("ignore::DeprecationWarning:gevent.*")
def test_tritonclient_binary_bytes_in_fp32_and_json_lines_out(ocr_server: Server) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(f"127.0.0.1:{ocr_server.port}", network_timeout=60.0)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("document-ocr")
        meta = client.get_model_metadata("document-ocr")
        assert {i["name"]: i["datatype"] for i in meta["inputs"]} == {"image": "BYTES", "text": "BYTES"}
        image = th.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([SAMPLE.read_bytes()], dtype=object))  # binary by default
        text = th.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"invoice total"], dtype=object))
        result = client.infer("document-ocr", [image, text])
        lines = [json.loads(x) for x in result.as_numpy("lines")]
        assert "INVOICE" in lines[0]["text"] and {"text", "score", "box"} == set(lines[0])
        emb = result.as_numpy("ocr_embedding")
        assert emb.dtype == np.float32 and emb.shape == (1, 384)
        assert abs(float(np.linalg.norm(emb)) - 1.0) < 1e-3
        q = result.as_numpy("text_embedding")
        assert q.dtype == np.float32 and q.shape == (1, 384)

        # JSON outputs requested explicitly, text only: the OCR outputs are pruned, so absent
        only = client.infer("document-ocr", [text], outputs=[th.InferRequestedOutput("text_embedding", False)])
        np.testing.assert_allclose(only.as_numpy("text_embedding"), q, atol=1e-5)
        assert only.as_numpy("lines") is None

        bad = th.InferInput("image", [1], "BYTES")
        bad.set_data_from_numpy(np.array([b"definitely not a png"], dtype=object))
        with pytest.raises(InferenceServerException, match="not a decodable image") as info:
            client.infer("document-ocr", [bad])
        assert info.value.status() == "400"
    finally:
        client.close()


@pytest.mark.parametrize(
    ("kwargs", "status", "field"),
    [
        ({"json": {"inputs": {"imgae": {"b64": "AAAA"}}}}, 400, "imgae"),
        ({"json": {"inputs": {"image": {"b64": "%%%"}}}}, 400, "image"),
        ({"files": {"image": ("x.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png")}}, 400, "image"),
        ({"content": b'{"inputs": ', "headers": {"content-type": "application/json"}}, 400, "body"),
        ({"content": b"hello", "headers": {"content-type": "text/plain"}}, 400, "content-type"),
        ({"json": {"inputs": {}}}, 400, None),
        ({"content": b"0" * (5 * 2**20), "headers": {"content-type": "application/json"}}, 413, "body"),
    ],
)
def test_bad_requests_get_json_with_field_and_fix(
    ocr_server: Server, kwargs: dict[str, object], status: int, field: str | None
) -> None:
    r = httpx.post(f"{ocr_server.url}/v1/infer", timeout=60, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    body = r.json()
    assert body.get("field") == field and body["fix"]


def test_image_above_the_pixel_limit_is_413(ocr_server: Server) -> None:
    # 7000 x 7000 = 49 M pixels > the graph's 40 M limit, in a few KB of 1-bit PNG
    buf = io.BytesIO()
    Image.new("1", (7000, 7000)).save(buf, format="PNG")
    r = httpx.post(f"{ocr_server.url}/v1/infer", files={"image": ("big.png", buf.getvalue(), "image/png")}, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["field"] == "image" and "49000000 pixels" in r.json()["message"]


def test_v2_shape_mismatch_and_unknown_model(ocr_server: Server) -> None:
    req = {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a"]}]}
    r = httpx.post(f"{ocr_server.url}/v2/models/document-ocr/infer", json=req, timeout=30)
    assert r.status_code == 400 and "needs 3 elements" in r.json()["error"]
    r = httpx.post(f"{ocr_server.url}/v2/models/other/infer", json=req, timeout=30)
    assert r.status_code == 404


def test_metrics_after_traffic(ocr_server: Server) -> None:
    httpx.post(
        f"{ocr_server.url}/v1/infer",
        files={"image": ("s.png", SAMPLE.read_bytes(), "image/png")},
        data={"text": "x"},
        timeout=60,
    )
    text = httpx.get(f"{ocr_server.url}/metrics", timeout=10).text
    for needle in (
        'usg_batch_size_count{model="rec"}',
        'usg_model_queue_wait_seconds_count{model="minilm"}',
        'usg_model_compute_seconds_count{model="det"}',
        'usg_batch_padding_waste_ratio_count{model="minilm"}',
        'usg_model_items_total{model="rec"}',
        'usg_request_seconds_count{modalities="image+text",status="ok"}',
        'usg_pruned_nodes_total{node="det"}',
        "usg_inflight_requests ",
        'usg_rejected_requests_total{reason="too_large"}',
        'usg_rejected_requests_total{reason="bad_input"}',
    ):
        assert needle in text, needle


def test_concurrent_texts_of_mixed_lengths_are_batched_and_all_answered(ocr_server: Server) -> None:
    # regression: the batcher's scheduler died on unequal-length items (list.index compared arrays)
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as c:
            texts = [f"query {i} " * (1 + i % 7) for i in range(96)]
            return list(
                await asyncio.gather(
                    *(c.post(f"{ocr_server.url}/v1/infer", json={"inputs": {"text": t}}) for t in texts)
                )
            )

    before = _sample(ocr_server, 'usg_batch_size_count{model="minilm"}')
    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 96
    assert all(len(r.json()["outputs"]["text_embedding"][0]) == 384 for r in responses)
    batches = _sample(ocr_server, 'usg_batch_size_count{model="minilm"}') - before
    assert batches < 96  # items shared backend calls


def _sample(server: Server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
