"""A Ray cluster started the way users start one (``ray start --head``), for the e2e tests that join it.

Its head runs with a Ray token at ``~/.ray/auth_token`` (any local ``ray.init()`` of Ray >= 2.59
writes one), so ``ray start`` turns token authentication on. One head serves the test session
(Ray's start-up is the expensive part); ``usg serve --ray-address`` processes join it one after
the other on its one Serve proxy port (``serve_port``: Serve keeps one proxy address per cluster).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from procs import free_port

CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")  # where `ray start` notes its address


@dataclass
class Head:
    proc: subprocess.Popen[bytes]
    address: str
    env: dict[str, str]  # HOME holding the cluster's token; no RAY_* settings
    log: Path
    serve_port: int  # the port every usg serve joining this head puts Serve's HTTP proxy on


def start_head(tmp: Path, timeout_s: float = 90.0) -> Head:
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
    # No drain on SIGTERM for the head itself: the session is over when it is stopped, and Ray's drain waits
    # up to 30 s for the Serve actors the tests leave on it (the joined processes' env stays without RAY_*).
    head_env = dict(env, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=head_env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.5)
    return Head(proc, f"127.0.0.1:{port}", env, log, free_port())


def stop_head(head: Head) -> None:
    head.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.proc.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.proc.pid, signal.SIGKILL)  # whatever of its group outlived it
    head.proc.wait(timeout=10)
    port = head.address.split(":")[1]
    if CURRENT_CLUSTER.exists() and CURRENT_CLUSTER.read_text().strip().endswith(f":{port}"):
        CURRENT_CLUSTER.unlink()  # or a later plain ray.init() would try to join the dead head
