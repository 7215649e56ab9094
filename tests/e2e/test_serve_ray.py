"""``usg serve GRAPH --engine ray`` as a real process: a local Ray cluster, the same HTTP API,
a clean exit on SIGTERM."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from harness import ROOT, start_server

pytest.importorskip("ray.serve")

SAMPLE = ROOT / "examples" / "document_ocr" / "sample.png"
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"


def test_ray_engine_serves_the_same_api_and_stops_cleanly(tmp_path: Path) -> None:
    """... and leaves the user's home as it was (no ~/.ray/auth_token), with a quiet stop."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(var, None)
    server = start_server(GRAPH, "--engine", "ray", "--timeout", "120", tmp=tmp_path, env=env)
    try:
        r = httpx.post(
            f"{server.url}/v1/infer",
            files={"image": ("sample.png", SAMPLE.read_bytes(), "image/png")},
            data={"text": "total due"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert "INVOICE" in body["outputs"]["lines"][0]["text"] and len(body["outputs"]["text_embedding"][0]) == 384
        bad = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"imgae": {"b64": "AAAA"}}}, timeout=60)
        assert bad.status_code == 400 and bad.json()["field"] == "imgae"
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert "usg_request_seconds" in metrics
        # what crossed between the router and the replicas, by transport (small calls on gRPC)
        assert 'usg_remote_bytes_total{direction="request",target="model-det",transport="object_store"}' in metrics
        assert 'target="model-rec",transport="grpc"' in metrics
    finally:
        code = server.stop()
    assert code == 0, server.output()
    out = " ".join(server.output().split())
    assert "with Ray Serve: model-cls, model-det, model-minilm, model-rec, router" in out
    assert "graceful_shutdown failed" not in out and "\x1b[" not in server.output(), server.output()[-3000:]
    assert "Token authentication is enabled" not in out
    # (ONNX Runtime itself writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime, in-process too)
    assert not (home / ".ray").exists(), sorted(str(p) for p in home.rglob("*"))


def test_ray_only_flags_are_refused_for_the_embedded_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from harness import USG

    p = subprocess.run([str(USG), "serve", str(GRAPH), "--ray-address", "auto"], capture_output=True, text=True)
    assert p.returncode == 2 and "--ray-address needs --engine ray" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([str(USG), "serve", str(GRAPH), "--deploy-timeout", "5"], capture_output=True, text=True)
    assert p.returncode == 2 and "--deploy-timeout needs --engine ray" in p.stderr and "Traceback" not in p.stderr


def test_an_unreachable_cluster_fails_fast_with_the_fix() -> None:
    import subprocess

    from harness import USG, free_port

    p = subprocess.run(
        [str(USG), "serve", str(GRAPH), "--engine", "ray", "--ray-address", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,  # Ray itself would retry for minutes
    )
    assert p.returncode == 1 and "cannot reach the Ray cluster" in p.stderr and "ray start --head" in p.stderr
    assert "Traceback" not in p.stderr
