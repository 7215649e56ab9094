"""Baselines ``usg bench --compare`` runs against USG: the same models, the same inputs.

- ``sequential``: the graph's executor without batching, one request at a time;
- ``http-stitched``: one FastAPI/uvicorn process per model, the client chains the calls;
- ``ray-serve``: one Ray Serve deployment per model with ``@serve.batch``, chained by an ingress;
- ``rapidocr``: RapidOCR's own engine from a thread pool, plus MiniLM on ONNX Runtime.
"""

from __future__ import annotations

from typing import Any

from usg.errors import UsageError
from usg.graph.model import Graph

__all__ = ["BASELINES", "make_baseline"]

BASELINES = ("sequential", "http-stitched", "ray-serve", "rapidocr")


def make_baseline(name: str, graph: Graph, *, workers: int) -> Any:
    """A not-yet-started target for baseline ``name`` (``await target.start()`` before use)."""
    if name == "sequential":
        from usg.bench.targets import InProcessTarget

        return InProcessTarget(graph, name="sequential", batching=False, gate=1)
    if name == "http-stitched":
        from usg.bench.baselines.http_stitched import HttpStitchedTarget

        return HttpStitchedTarget(graph)
    if name == "ray-serve":
        from usg.bench.baselines.ray_serve import RayServeTarget

        return RayServeTarget(graph)
    if name == "rapidocr":
        from usg.bench.baselines.rapidocr_pool import RapidOcrPoolTarget

        return RapidOcrPoolTarget(graph, workers=workers)
    raise UsageError(f"--compare {name!r}: unknown baseline; fix: use one or more of {', '.join(BASELINES)}")
