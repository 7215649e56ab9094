"""Baseline ``ray-serve``: the graph's models as Ray Serve deployments, chained by an ingress.

Deployments: ``det``, ``cls``, ``rec`` (ONNX Runtime, the graph's thread counts) and ``minilm``
(tokenizer + ONNX Runtime), each taking one item per call and batching across requests with
``@serve.batch`` (``max_batch_size`` / ``batch_wait_timeout_s`` from the graph's batch policy;
inside a batch, items of equal shape share one session call, because PP-OCR rec is not
pad-safe; MiniLM pads to the longest text). The ingress deployment does the same
``usg.ops.ocr`` pre/post-processing as the graph (in a thread) and calls the models through
``DeploymentHandle``s: det → cls (each crop) → rec (each crop), and MiniLM for the OCR text
and the query text. The benchmark client calls the ingress through its handle (no HTTP
proxy). Each model gets as many replicas as the graph's ``options.concurrency`` (its instance
count). Every replica runs in its own Ray worker process; ``max_ongoing_requests`` is raised
to 256 so no replica throttles the load.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from usg.bench.baselines.models import TextEmbedder, onnx_session, run_stacked
from usg.bench.baselines.pipeline import DocModels, doc_models, group_by_shape, run_document
from usg.bench.samples import Sample
from usg.errors import MissingDependency
from usg.graph.model import Graph

__all__ = ["RayServeTarget", "build_app", "ray_session"]

_MAX_ONGOING = 256


def _import_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise MissingDependency("ray", "ray", "the ray-serve baseline") from None
    return serve


def ray_session() -> None:
    """Start a local Ray (no dashboard) and Serve without an HTTP proxy, if not running."""
    import ray

    serve = _import_serve()
    if not ray.is_initialized():
        ray.init(
            address="local",  # a private Ray, not one `ray start` runs here (it would refuse num_cpus)
            num_cpus=max(2, os.cpu_count() or 2),
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    serve.start(proxy_location="Disabled")


def build_app(models: DocModels) -> Any:
    """The Serve application: ingress + det/cls/rec/minilm deployments."""
    serve = _import_serve()
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": _MAX_ONGOING}

    @serve.deployment(**options)
    class OnnxModel:
        def __init__(self, path: str, threads: int, max_batch: int, wait_s: float) -> None:
            self.backend = onnx_session(Path(path), threads)
            self.infer_batch.set_max_batch_size(max_batch)
            self.infer_batch.set_batch_wait_timeout_s(wait_s)

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.003)
        async def infer_batch(self, items: list[np.ndarray]) -> list[np.ndarray]:
            out: list[np.ndarray] = [np.empty(0)] * len(items)
            for idx in group_by_shape(items):
                ys = await asyncio.to_thread(run_stacked, self.backend, [items[i] for i in idx])
                for i, y in zip(idx, ys, strict=True):
                    out[i] = y
            return out

        async def __call__(self, x: np.ndarray) -> np.ndarray:
            result: np.ndarray = await self.infer_batch(x)
            return result

    @serve.deployment(**options)
    class Embedder:
        def __init__(
            self, tokenizer: str, path: str, threads: int, max_length: int, max_batch: int, wait_s: float
        ) -> None:
            self.embedder = TextEmbedder(Path(tokenizer), Path(path), threads=threads, max_length=max_length)
            self.embed_batch.set_max_batch_size(max_batch)
            self.embed_batch.set_batch_wait_timeout_s(wait_s)

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.003)
        async def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
            y = await asyncio.to_thread(self.embedder.embed, texts)
            return [y[i : i + 1] for i in range(len(texts))]

        async def __call__(self, text: str) -> np.ndarray:
            result: np.ndarray = await self.embed_batch(text)
            return result

    @serve.deployment(**options)
    class Ingress:
        def __init__(self, det: Any, cls: Any, rec: Any, embed: Any, models: DocModels) -> None:
            self.det, self.cls, self.rec, self.embed_handle = det, cls, rec, embed
            self.models = models

        async def _det(self, x: np.ndarray) -> np.ndarray:
            result: np.ndarray = await self.det.remote(x)
            return result

        async def _cls(self, items: list[np.ndarray]) -> list[np.ndarray]:
            return list(await asyncio.gather(*(self.cls.remote(i) for i in items)))

        async def _rec(self, items: list[np.ndarray]) -> list[np.ndarray]:
            return list(await asyncio.gather(*(self.rec.remote(i) for i in items)))

        async def _embed(self, texts: list[str]) -> list[np.ndarray]:
            return list(await asyncio.gather(*(self.embed_handle.remote(t) for t in texts)))

        async def __call__(self, image: np.ndarray | None, text: str | None) -> dict[str, Any]:
            sample = Sample("request", image, text)
            return await run_document(
                sample, self.models, det=self._det, cls=self._cls, rec=self._rec, embed=self._embed
            )

    def wait_s(model: str) -> float:
        return models.max_delay_ms[model] / 1000.0

    def onnx(model: str) -> Any:
        return OnnxModel.options(name=model, num_replicas=models.instances[model]).bind(  # type: ignore[attr-defined]
            str(models.paths[model]), models.threads[model], models.max_batch[model], wait_s(model)
        )

    embed = Embedder.options(name="minilm", num_replicas=models.instances["minilm"]).bind(  # type: ignore[attr-defined]
        str(models.paths["tokenizer"]),
        str(models.paths["minilm"]),
        models.threads["minilm"],
        models.tokenizer_max_length,
        models.max_batch["minilm"],
        wait_s("minilm"),
    )
    return Ingress.bind(onnx("det"), onnx("cls"), onnx("rec"), embed, models)  # type: ignore[attr-defined]


class RayServeTarget:
    name = "ray-serve"
    # a private Ray keeps a core busy in part while idle (GCS, raylet, the Serve controller's loop,
    # replicas' health checks and metrics): usg bench starts it for its own runs only (runner.py)
    idle_cpu = True

    def __init__(self, graph: Graph) -> None:
        self.models = doc_models(graph, "ray-serve")
        self._handle: Any = None

    async def start(self) -> None:
        serve = _import_serve()

        def deploy() -> Any:
            ray_session()
            return serve.run(build_app(self.models), name="usg_bench", route_prefix=None)

        self._handle = await asyncio.to_thread(deploy)

    async def infer(self, sample: Sample) -> dict[str, Any]:
        result: dict[str, Any] = await self._handle.remote(sample.image, sample.text)
        return result

    async def aclose(self) -> None:
        if self._handle is None:
            return
        serve = _import_serve()

        def stop() -> None:
            from usg.scale.ray_app import stop_private_ray

            serve.shutdown()
            stop_private_ray()

        await asyncio.to_thread(stop)
        self._handle = None
