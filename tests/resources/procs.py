"""Server processes for e2e tests: a free 127.0.0.1 port, bounded readiness wait, clean stop.

Shared by the ``usg serve`` harness (tests/resources/serve) and the tritonserver harness
(tests/resources/triton_server); importable as ``procs`` (tests/conftest.py puts this folder on
``sys.path``).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 30 s; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)

    def wait_ready(self, ready_url: str, *, name: str, timeout_s: float, poll_s: float = 0.2) -> None:
        """Poll ``ready_url`` until it answers 200; RuntimeError (with the log's tail) if the process
        exits first or ``timeout_s`` passes (the process is stopped then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(poll_s)
        self.stop()
        raise RuntimeError(f"{name} not ready after {timeout_s:.0f} s:\n{self.output()[-4000:]}")
