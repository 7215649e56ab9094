"""Baseline ``http-stitched``: each model its own HTTP microservice process, the client chains them.

Four uvicorn processes (det, cls, rec: ONNX Runtime; minilm: tokenizer + ONNX Runtime) on
127.0.0.1, each with the graph's intra-op thread count. The client does pre/post-processing
with the same ``usg.ops.ocr`` functions, sends arrays as ``.npy`` bodies over keep-alive
connections, and batches what one request allows: all cls crops in one call, rec crops of
equal width in one call (as RapidOCR does) — no batching across requests, as such services
usually have none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from usg.bench.baselines.http_service import npy_bytes, npy_load
from usg.bench.baselines.pipeline import doc_models, group_by_shape, run_document
from usg.bench.samples import Sample
from usg.errors import BackendError, MissingDependency
from usg.graph.model import Graph

__all__ = ["HttpStitchedTarget", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpStitchedTarget:
    name = "http-stitched"

    def __init__(self, graph: Graph, *, startup_timeout_s: float = 60.0) -> None:
        self.models = doc_models(graph, "http-stitched")
        self.startup_timeout_s = startup_timeout_s
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, Any] = {}
        self._ports: dict[str, int] = {}
        self._client: Any = None

    async def start(self) -> None:
        for module in ("fastapi", "uvicorn", "httpx"):
            try:
                __import__(module)
            except ImportError:
                raise MissingDependency(module, "bench", "the http-stitched baseline") from None
        import httpx

        m = self.models
        for name in ("det", "cls", "rec", "minilm"):
            port = free_port()
            cmd = [sys.executable, "-m", "usg.bench.baselines.http_service", "--port", str(port)]
            if name == "minilm":
                cmd += [
                    "embed",
                    "--path",
                    str(m.paths["minilm"]),
                    "--tokenizer",
                    str(m.paths["tokenizer"]),
                    "--max-length",
                    str(m.tokenizer_max_length),
                ]
            else:
                cmd += ["onnx", "--path", str(m.paths[name])]
            cmd += ["--threads", str(m.threads[name])]
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in aclose()
            self._logs[name] = log
            self._procs[name] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONWARNINGS": "ignore"}
            )
            self._ports[name] = port
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self._client = httpx.AsyncClient(timeout=120.0, limits=limits)
        deadline = time.monotonic() + self.startup_timeout_s
        for name, port in self._ports.items():
            while True:
                proc = self._procs[name]
                if proc.poll() is not None:
                    self._logs[name].seek(0)
                    err = self._logs[name].read().decode(errors="replace")[-2000:]
                    raise BackendError(f"http-stitched: the {name} service exited ({proc.returncode}): {err}")
                with contextlib.suppress(httpx.TransportError):
                    if (await self._client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"http-stitched: the {name} service did not start within {self.startup_timeout_s:g} s"
                    )
                await asyncio.sleep(0.2)

    async def _post_array(self, model: str, x: np.ndarray) -> np.ndarray:
        resp = await self._client.post(f"http://127.0.0.1:{self._ports[model]}/infer", content=npy_bytes(x))
        resp.raise_for_status()
        return npy_load(resp.content)

    async def _stacked(self, model: str, items: list[np.ndarray]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.empty(0)] * len(items)

        async def group(idx: list[int]) -> None:
            y = await self._post_array(model, np.concatenate([items[i] for i in idx], axis=0))
            for j, i in enumerate(idx):
                out[i] = y[j : j + 1]

        await asyncio.gather(*(group(g) for g in group_by_shape(items)))
        return out

    async def _embed(self, texts: list[str]) -> list[np.ndarray]:
        resp = await self._client.post(f"http://127.0.0.1:{self._ports['minilm']}/embed", json={"texts": texts})
        resp.raise_for_status()
        y = npy_load(resp.content)
        return [y[i : i + 1] for i in range(len(texts))]

    async def infer(self, sample: Sample) -> dict[str, Any]:
        async def det(x: np.ndarray) -> np.ndarray:
            return await self._post_array("det", x)

        async def cls(items: list[np.ndarray]) -> list[np.ndarray]:
            return await self._stacked("cls", items)

        async def rec(items: list[np.ndarray]) -> list[np.ndarray]:
            return await self._stacked("rec", items)

        return await run_document(sample, self.models, det=det, cls=cls, rec=rec, embed=self._embed)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        for proc in self._procs.values():
            proc.terminate()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for log in self._logs.values():
            log.close()
