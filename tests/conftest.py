"""Shared fixtures: paths of the bundled example and of small test resources."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ROOT / "tests" / "resources"
EXAMPLE_GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"

# test helper modules (node functions used by resource graphs) import as `testops`
sys.path.insert(0, str(RESOURCES))


@pytest.fixture(scope="session")
def example_graph_path() -> Path:
    return EXAMPLE_GRAPH


@pytest.fixture(scope="session")
def resources() -> Path:
    return RESOURCES
