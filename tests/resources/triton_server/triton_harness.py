"""A real Triton Inference Server for the e2e export tests, from PyPI's ``nvidia-pytriton`` wheel.

The wheel bundles ``tritonserver`` (2.51) with the Python backend only. It is installed in an
environment of its own, ``$USG_CACHE/triton-server-<version>`` (built once, then reused), not in
the project's:

- nvidia-pytriton pins ``numpy<2``, while ``usg[all]`` needs numpy 2 (opencv-python);
- the bundled Python-backend stub was built against numpy 1.x: under numpy 2 it misreads arrays
  (inputs arrive with a stride of 0, outputs come back empty, string tensors crash the stub).

So that environment is a venv holding ``nvidia-pytriton`` (without its dependencies) and
``numpy<2``, chained to this interpreter's site-packages (usg and everything it needs) by a
``.pth`` file. The stub embeds libpython and finds that venv through ``PATH``, as pytriton does.
:func:`unavailable` says why a platform cannot run the binary; tests skip only then.
"""

from __future__ import annotations

import os
import platform
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from procs import ServerProcess, free_port

PYTRITON = "nvidia-pytriton==0.7.0"
READY_TIMEOUT_S = 180.0
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def _cache() -> Path:
    from usg.graph.paths import cache_dir

    return cache_dir() / f"triton-server-{PYTRITON.split('==')[1]}"


def _site(venv: Path) -> Path:
    return venv / "lib" / f"python{PY}" / "site-packages"


def _libpython_dir() -> Path | None:
    libdir = sysconfig.get_config_var("LIBDIR")
    name = f"libpython{PY}.so.1.0"
    return Path(libdir) if libdir and (Path(libdir) / name).exists() else None


def unavailable() -> str | None:
    """Why this platform cannot run the bundled tritonserver, or None."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"the tritonserver in {PYTRITON} is built for Linux x86_64, not {sys.platform} {platform.machine()}"
    if _libpython_dir() is None:
        return f"this Python has no shared libpython{PY}.so, which Triton's Python-backend stub links"
    return None


def provision() -> Path:
    """The venv holding tritonserver and numpy<2 (created on first use); RuntimeError if pip fails."""
    venv = _cache()
    done = venv / ".usg-ready"
    if done.exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    target = _site(venv)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    result = subprocess.run([*pip, PYTRITON, "numpy<2"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip could not install {PYTRITON} and numpy<2: {result.stderr[-2000:]}")
    chain = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    (target / "zz_usg_project.pth").write_text(chain)
    done.write_text(PYTRITON)
    return venv


@dataclass
class Triton(ServerProcess):
    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


def _backends(venv: Path, tmp: Path) -> Path:
    dist = _site(venv) / "pytriton" / "tritonserver"
    backends = tmp / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for f in (dist / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy2(f, python / f.name)
    stub = dist / "python_backend_stubs" / PY / "triton_python_backend_stub"
    shutil.copy2(stub, python / stub.name)
    return backends


def start_triton(repository: Path, *, tmp: Path) -> Triton:
    """Start tritonserver on ``repository`` (HTTP on a free 127.0.0.1 port); wait until it is ready."""
    venv = provision()
    dist = _site(venv) / "pytriton" / "tritonserver"
    env = dict(os.environ)
    libs = [str(_site(venv) / "nvidia_pytriton.libs"), str(_libpython_dir())]
    env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    port = free_port()
    log = tmp / f"triton-{port}.log"
    cmd = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={_backends(venv, tmp)}",
        "--http-address=127.0.0.1",
        f"--http-port={port}",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--disable-auto-complete-config",
        "--exit-on-error=true",
        "--exit-timeout-secs=10",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    server = Triton(proc, port, log)
    ready = f"http://{server.url}/v2/health/ready"
    server.wait_ready(ready, name="tritonserver", timeout_s=READY_TIMEOUT_S, poll_s=0.5)
    return server
