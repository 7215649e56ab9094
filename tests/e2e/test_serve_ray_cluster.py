"""``usg serve --engine ray`` beside a cluster that ``ray start --head`` runs on this machine.

The head is started the way users start one, with a Ray token at ``~/.ray/auth_token`` (any
local ``ray.init()`` of Ray >= 2.59 writes one), so ``ray start`` turns token authentication
on. USG must join it by address (sending the token), leave it running when it stops (even on
two SIGTERMs at once), say what to fix when the token is wrong, and, without an address,
start a private local Ray instead of tripping over the running one.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import ROOT, USG, start_server
from procs import free_port

pytest.importorskip("ray.serve")

GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")  # where `ray start` notes its address


@dataclass
class Head:
    proc: subprocess.Popen[bytes]
    address: str
    env: dict[str, str]  # HOME holding the cluster's token; no RAY_* settings
    log: Path


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    tmp = tmp_path_factory.mktemp("ray-head")
    home = tmp / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(home)
    env.setdefault("USG_CACHE", "/tmp/usgcache")
    port = free_port()
    log = tmp / "head.log"
    ray_cli = Path(sys.executable).parent / "ray"
    cmd = [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.5)
    try:
        yield Head(proc, f"127.0.0.1:{port}", env, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # `ray start --block` drains, then stops its processes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if CURRENT_CLUSTER.exists() and CURRENT_CLUSTER.read_text().strip().endswith(f":{port}"):
            CURRENT_CLUSTER.unlink()  # or a later plain ray.init() would try to join the dead head


def test_joins_a_token_authenticated_cluster_and_leaves_it_running(head: Head, tmp_path: Path) -> None:
    assert "Token authentication is enabled" in head.log.read_text(errors="replace")  # what a plain join trips on
    server = start_server(GRAPH, "--engine", "ray", "--ray-address", head.address, tmp=tmp_path, env=head.env)
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
        [sys.executable, "-c", _START_SERVE.format(address=head.address, port=free_port())],
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
