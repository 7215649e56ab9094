"""``usg serve --engine ray`` beside a cluster that ``ray start --head`` runs on this machine.

The head is started the way users start one, with a Ray token at ``~/.ray/auth_token`` (any
local ``ray.init()`` of Ray >= 2.59 writes one), so ``ray start`` turns token authentication
on. USG must join it by address (sending the token), leave it running when it stops (even on
two SIGTERMs at once), say what to fix when the token is wrong, and, without an address,
start a private local Ray instead of tripping over the running one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from harness import ROOT, USG, start_server
from procs import free_port
from ray_head import CURRENT_CLUSTER, Head

pytest.importorskip("ray.serve")

GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"


@pytest.fixture(scope="module")
def head(ray_head: Head) -> Head:
    """The session's ``ray start --head`` cluster (tests/resources/serve/ray_head.py)."""
    return ray_head


def test_joins_a_token_authenticated_cluster_and_leaves_it_running(head: Head, tmp_path: Path) -> None:
    assert "Token authentication is enabled" in head.log.read_text(errors="replace")  # what a plain join trips on
    server = start_server(
        GRAPH, "--engine", "ray", "--ray-address", head.address, tmp=tmp_path, env=head.env, port=head.serve_port
    )
    try:
        r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "total due"}}, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["outputs"]["text_embedding"][0]) == 384
        # a process manager and `timeout` may both send SIGTERM: stop once, cleanly
        server.proc.send_signal(signal.SIGTERM)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0, server.output()
    finally:
        server.stop()
    assert head.proc.poll() is None, head.log.read_text(errors="replace")  # the cluster is not ours to stop
    joined = subprocess.run(
        [sys.executable, "-c", _PROBE.format(address=head.address)], env=head.env, capture_output=True, text=True
    )
    assert joined.returncode == 0, joined.stderr[-3000:]
    assert joined.stdout.split() == [head.address.split(":")[1], "[]"]  # same cluster, our app deleted


def test_a_wrong_token_gets_a_fix_that_names_the_token(head: Head) -> None:
    env = {**head.env, "RAY_AUTH_TOKEN": "0" * 64}
    p = subprocess.run(
        [str(USG), "serve", str(GRAPH), "--engine", "ray", "--ray-address", head.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert "cannot join the Ray cluster" in p.stderr and "ray get-auth-token" in p.stderr
    assert "Traceback" not in p.stderr


def test_without_an_address_a_private_local_ray_starts(head: Head) -> None:
    assert CURRENT_CLUSTER.read_text().strip().endswith(head.address.split(":")[1])  # Ray would join it
    code = "from usg.scale.ray_app import connect_ray; connect_ray(num_cpus=1); import ray; " + (
        "print(ray.get_runtime_context().gcs_address)"
    )
    p = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not p.stdout.strip().endswith(":" + head.address.split(":")[1])


def test_a_serve_proxy_already_elsewhere_is_named_with_the_fix(head: Head) -> None:
    """Serve keeps one proxy address per cluster: asking for another port must not claim a dead URL."""
    started = subprocess.run(
        [sys.executable, "-c", _START_SERVE.format(address=head.address, port=head.serve_port)],
        env=head.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    running = int(started.stdout.split()[-1])
    other = free_port()
    p = subprocess.run(
        [str(USG), "serve", str(GRAPH), "--engine", "ray", "--ray-address", head.address, "--port", str(other)],
        env=head.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"HTTP proxy on 127.0.0.1:{running}, not the 127.0.0.1:{other}" in " ".join(p.stderr.split())
    assert f"--port {running}" in p.stderr and "Traceback" not in p.stderr


_START_SERVE = """
import os
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray import serve
from ray.serve.context import _get_global_client
ray.init(address="{address}", logging_level="ERROR", log_to_driver=False)
serve.start(http_options={{"host": "127.0.0.1", "port": {port}}})
print(_get_global_client().http_config.port)
"""

_PROBE = """
import os
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray import serve
ray.init(address="{address}", logging_level="ERROR", log_to_driver=False)
print(ray.get_runtime_context().gcs_address.split(":")[1], sorted(serve.status().applications))
"""
