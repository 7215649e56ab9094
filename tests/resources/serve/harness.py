"""Test harness for e2e serve tests: start real ``usg serve`` processes on free 127.0.0.1 ports and wait
(bounded) until they are ready. Imported by tests/e2e/conftest.py (this folder is put on sys.path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
SERVE_RESOURCES = ROOT / "tests" / "resources" / "serve"
USG = Path(sys.executable).parent / "usg"  # the console script of this venv (no usg/__main__.py yet)
READY_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)


def start_server(graph: Path, *args: str, tmp: Path) -> Server:
    port = free_port()
    env = dict(os.environ)
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
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"usg serve exited with {proc.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.url}/v2/health/ready", timeout=1.0).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"usg serve was not ready within {READY_TIMEOUT_S:g} s:\n{server.output()}")
