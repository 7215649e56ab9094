"""POST /v1/search against a real ``usg serve GRAPH --index INDEX`` process (one server start)."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import ROOT, USG, Server, start_server
from PIL import Image

from usg.testing.documents import Line, render_document

if importlib.util.find_spec("faiss") is None:
    pytest.skip("usg[index] (faiss-cpu) is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"
DOCS = {
    "invoice.png": ["Invoice number 55012", "Total due EUR 401.40", "Payment within thirty days"],
    "shipping.png": ["Shipping address", "42 Baker Street London", "Tracking code QX93020"],
}


def png(lines: list[str]) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(render_document([Line(t, size=28) for t in lines])).save(buf, format="PNG")
    return buf.getvalue()


def env() -> dict[str, str]:
    return {**os.environ, "USG_CACHE": os.environ.get("USG_CACHE", "/tmp/usgcache")}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pages = tmp_path_factory.mktemp("pages")
    for name, lines in DOCS.items():
        (pages / name).write_bytes(png(lines))
    (pages / "notes.txt").write_text("Call the plumber about the leak\nWater the plants\n")
    out = tmp_path_factory.mktemp("idx") / "index"
    r = subprocess.run(
        [str(USG), "index", "build", str(pages), "-o", str(out), "--collection", "scans"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def server(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(GRAPH, "--index", str(index_dir), "--max-body-mb", "4", tmp=tmp_path_factory.mktemp("srv"))
    yield s
    assert s.stop() == 0, s.output()


def post(server: Server, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/search", timeout=60, **kw)  # type: ignore[arg-type]


def test_text_query_returns_the_line_with_document_box_and_score(server: Server) -> None:
    r = post(server, json={"query": "Tracking code QX93020", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query"] == "Tracking code QX93020" and len(body["results"]) == 3 and body["request_id"]
    top = body["results"][0]
    assert top["document"] == "shipping.png" and top["collection"] == "scans" and top["kind"] == "line"
    assert "".join(top["text"].split()).lower() == "trackingcodeqx93020"  # PP-OCR may drop spaces, read x for X
    assert len(top["box"]) == 4 and isinstance(top["score"], float)
    r = post(server, json={"query": "plumbing problem", "k": 1, "collections": ["scans"]})
    assert r.json()["results"][0] == {
        **r.json()["results"][0],
        "document": "notes.txt",
        "text": "Call the plumber about the leak",
        "box": None,
    }


def test_multipart_text_and_image_queries(server: Server) -> None:
    r = post(server, data={"query": "money owed", "k": "2"})
    assert r.status_code == 200 and r.json()["results"][0]["document"] == "invoice.png"
    image = png(["Invoice number 99120", "Total due EUR 12.00"])  # another invoice: reads like invoice.png
    r = post(server, files={"image": ("q.png", image, "image/png")}, data={"k": "3"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [h["kind"] for h in body["results"]] == ["page"] * 3
    assert body["results"][0]["document"] == "invoice.png"
    assert any("99120" in t for t in body["image_lines"])
    r = post(server, json={"image": {"b64": base64.b64encode(image).decode()}, "k": 1})
    assert r.status_code == 200 and r.json()["results"][0]["document"] == "invoice.png"


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"json": {"query": "   "}}, "query", "query is empty"),
        ({"json": {"query": "x", "k": 0}}, "k", "k=0 is out of range"),
        ({"json": {"query": "x", "k": "many"}}, "k", "is not an integer"),
        ({"json": {"query": "x", "k": 2.5}}, "k", "k=2.5 is not an integer"),  # was answered as k=2
        # a JSON number past float's range reads as inf: was a 500 (OverflowError in int())
        ({"content": b'{"query": "x", "k": 1e999}', "headers": {"content-type": "application/json"}}, "k", "k=inf"),
        ({"json": {"query": 3}}, "query", "query must be a string"),
        ({"json": {"q": "x"}}, "q", "unknown field(s) ['q']"),
        ({"json": {}}, "query", "no query given"),
        ({"json": [1]}, "body", "body must be a JSON object"),
        ({"content": b"{", "headers": {"content-type": "application/json"}}, "body", "not valid JSON"),
        ({"content": b"hi", "headers": {"content-type": "text/plain"}}, "content-type", "not supported"),
        ({"json": {"image": {"b64": "@@@"}}}, "image", "not valid base64"),
    ],
)
def test_bad_requests_get_400_naming_the_field_and_the_fix(server: Server, kwargs, field, message) -> None:
    r = post(server, **kwargs)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body.get("field") == field and message in body["message"] and body.get("fix")


def test_unknown_collection_blank_image_and_metrics(server: Server) -> None:
    r = post(server, json={"query": "x", "collections": ["nope"]})
    assert r.status_code == 400 and "no collection 'nope'" in r.json()["message"]
    blank = io.BytesIO()
    Image.new("RGB", (300, 200), "white").save(blank, format="PNG")
    r = post(server, files={"image": ("b.png", blank.getvalue(), "image/png")})
    assert r.status_code == 400 and "no text was read from the query image" in r.json()["message"]
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'endpoint="v1_search"' in metrics


def test_an_index_of_another_encoder_is_refused_at_start(index_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(index_dir, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["encoder"]["sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(manifest))
    r = subprocess.run(
        [str(USG), "serve", str(GRAPH), "--index", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert r.returncode == 1
    assert "built with encoder sha256 000000000000" in r.stderr and "fix: query with the graph" in r.stderr
