"""inf / nan in the graph's other numeric sections (deploy, align, cache, monitor) are problems
naming field, value and fix: before, ``num_replicas: .inf`` was an OverflowError shown as
"internal error", and a nan tolerance, TTL or sample share was accepted (it compares false
with everything, so the setting silently did nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from usg.errors import GraphError
from usg.graph import load_graph
from usg.graph.align import parse_align
from usg.graph.cache import parse_cache
from usg.graph.deploy import parse_deploy

MONITOR = Path(__file__).resolve().parents[1] / "resources" / "monitor"


@pytest.mark.parametrize(
    ("router", "match"),
    [
        ({"num_replicas": float("inf")}, r"deploy\.router\.num_replicas: num_replicas is inf"),
        ({"max_replicas": float("nan")}, r"deploy\.router\.max_replicas: max_replicas is nan"),
        ({"target_ongoing_requests": float("inf")}, r"target_ongoing_requests is inf"),
    ],
)
def test_deploy_non_finite_numbers(router: dict[str, float], match: str) -> None:
    problems = parse_deploy({"router": router}, models={}, nodes={})[1]
    assert problems, "accepted"
    text = "\n".join(str(p) for p in problems)
    assert re.search(match, text) and "fix: use a finite" in text, text


@pytest.mark.parametrize("key", ["tolerance_ms", "max_wait_ms"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_align_non_finite_times(key: str, value: float) -> None:
    _, _, problems = parse_align("nodes.al.align", {"streams": {"a": "inputs.a", "b": "inputs.b"}, key: value})
    assert [p.where for p in problems] == [f"nodes.al.align.{key}"]
    assert f"{key} is {value!r}" in problems[0].message and "finite" in problems[0].fix


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_cache_non_finite_ttl(value: float) -> None:
    _, problems = parse_cache({"backend": "memory", "ttl_s": value})
    assert [p.where for p in problems] == ["cache.ttl_s"] and f"ttl_s is {value!r}" in problems[0].message


@pytest.mark.parametrize("key", ["sample", "reference_size"])
def test_monitor_non_finite_numbers(key: str) -> None:
    from usg.monitor.config import parse_monitor

    graph = load_graph(MONITOR / "graph.yaml")
    with pytest.raises(GraphError, match=rf"monitor\.{key}: {key} is nan\n.*fix: use a finite, positive number"):
        parse_monitor({key: float("nan")}, graph)
