"""Each baseline gives the same outputs as USG on a sample (OCR text equal, embeddings ≤ 1e-4 cosine).

Ray Serve and the HTTP microservices start real processes; each test is bounded and skips
with a reason when its optional dependency is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from usg.bench.baselines import make_baseline
from usg.bench.equivalence import check_equivalence
from usg.bench.samples import default_samples
from usg.bench.targets import InProcessTarget
from usg.graph import load_graph

GRAPH = Path(__file__).resolve().parents[2] / "examples" / "document_ocr" / "graph.yaml"

pytestmark = [
    pytest.mark.slow,
    # Ray's own import-time noise (not ours): pydantic/protobuf deprecations inside ray
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:pydantic.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


@pytest.fixture(scope="module")
def graph():
    return load_graph(GRAPH, export_missing=True)


@pytest.fixture(scope="module")
def reference(graph):
    samples = default_samples()[:2]

    async def go():
        target = InProcessTarget(graph)
        await target.start()
        try:
            return [await target.infer(s) for s in samples]
        finally:
            await target.aclose()

    return samples, asyncio.run(go())


def check(name: str, graph, reference, *, starts: int = 1) -> None:
    """``starts`` > 1: the target is stopped and started again, as usg bench does with a baseline
    that keeps CPU busy while idle (``idle_cpu``), and checked after each start."""
    samples, refs = reference

    async def go():
        target = make_baseline(name, graph, workers=2)
        outs = []
        for _ in range(starts):
            await target.start()
            try:
                outs.append([await target.infer(s) for s in samples])
            finally:
                await target.aclose()
        return outs

    for outs in asyncio.run(go()):
        eq = check_equivalence(name, "usg", [(s.name, r, o) for s, r, o in zip(samples, refs, outs, strict=True)])
        assert eq.ok, eq.problems
        assert all(o["lines"] for o in outs)


@pytest.mark.timeout(60)
def test_sequential_matches_usg(graph, reference):
    check("sequential", graph, reference)


@pytest.mark.timeout(60)
def test_rapidocr_pool_matches_usg(graph, reference):
    check("rapidocr", graph, reference)


@pytest.mark.timeout(60)
def test_http_stitched_matches_usg(graph, reference):
    for module in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install fastapi uvicorn)")
    check("http-stitched", graph, reference)


@pytest.mark.timeout(180)
def test_ray_serve_matches_usg_after_a_restart(graph, reference):
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        pytest.skip("ray[serve] is not installed (pip install 'ray[serve]')")
    check("ray-serve", graph, reference, starts=2)
