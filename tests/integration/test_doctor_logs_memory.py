"""`usg doctor logs` on a large log: peak memory stays near that of a one-line log (the file is read a chunk at
a time, not whole)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_cli_reads_a_large_log_in_bounded_memory(tmp_path: Path) -> None:
    """The log is 48 MB of 8 KB lines with the cause at the end; the process's peak memory is that of a
    1-line log plus little, where reading the file whole needed several times the file."""
    code = (
        "import resource, sys\n"
        "from click.testing import CliRunner\n"
        "from usg.cli.doctor_logs_cmd import logs\n"
        "r = CliRunner().invoke(logs, [sys.argv[1], '--format', 'json'])\n"
        "assert 'LOG012' in r.output, r.output[-2000:]\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    cause = b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    small.write_bytes(cause)
    line = b"2026-12-06 INFO " + b"k=v " * 2044 + b"\n"
    with big.open("wb") as fh:
        for _ in range(6):
            fh.write(line * 1000)
        fh.write(cause)
    assert big.stat().st_size > 48_000_000

    def peak_mib(path: Path) -> int:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.strip().splitlines()[-1])

    base, large = peak_mib(small), peak_mib(big)
    assert large < base + 32, (base, large)  # 150 -> 163 MiB here; reading the file whole: 150 -> 244
