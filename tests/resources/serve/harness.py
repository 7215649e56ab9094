"""Test harness for e2e serve tests: start real ``usg serve`` processes on free 127.0.0.1 ports and wait
(bounded) until they are ready. Imported by tests/e2e/conftest.py (this folder is put on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from procs import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[3]
SERVE_RESOURCES = ROOT / "tests" / "resources" / "serve"
USG = Path(sys.executable).parent / "usg"  # the console script of this venv (no usg/__main__.py yet)
READY_TIMEOUT_S = 90.0


@dataclass
class Server(ServerProcess):
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def start_server(
    graph: Path, *args: str, tmp: Path, env: Mapping[str, str] | None = None, port: int | None = None
) -> Server:
    """``usg serve graph *args`` on ``port`` (default: a free one), ready; ``env`` replaces the
    process environment."""
    port = port or free_port()
    env = dict(os.environ if env is None else env)
    env.setdefault("USG_CACHE", "/tmp/usgcache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SERVE_RESOURCES), env.get("PYTHONPATH")) if p)
    log = tmp / f"serve-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                str(USG),
                "serve",
                str(graph),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                *args,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = Server(proc, port, log)
    server.wait_ready(f"{server.url}/v2/health/ready", name="usg serve", timeout_s=READY_TIMEOUT_S, poll_s=0.1)
    return server
