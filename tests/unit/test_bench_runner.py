"""``run_bench``'s steps on a tiny Python-node graph: start and check systems, rounds, merging, bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from usg.bench.runner import BenchConfig, run_bench
from usg.bench.samples import Sample
from usg.errors import UsageError
from usg.graph import load_graph

GRAPH = """
name: shout
inputs: {text: {modality: text}}
nodes: {up: {fn: "testops:upper", inputs: {text: inputs.text}}}
outputs: {shout: up.text}
"""


@pytest.fixture()
def graph(tmp_path: Path):
    p = tmp_path / "shout.yaml"
    p.write_text(GRAPH)
    return load_graph(p)


def test_rounds_merge_per_system_and_level_and_bounds_follow_each_usg_run(graph):
    cfg = BenchConfig(
        "shout.yaml",
        concurrency=(1, 2),
        duration_s=0.3,
        warmup_s=0.0,
        compare=("sequential",),
        rounds=2,
        samples=[Sample("a", text="hello"), Sample("b", text="world")],
    )
    seen: list[tuple[str, str]] = []
    bounds: list[dict[str, float]] = []

    def progress(system: str, level: str, _total: float):
        seen.append((system, level))
        return None

    def bound(per_request):
        bounds.append(dict(per_request))
        return {"bound_rps": 1000.0}

    report = asyncio.run(run_bench(cfg, graph, progress=progress, bound=bound))
    # round 1 in the given order, round 2 reversed, per level
    assert [s for s, _ in seen] == ["usg", "sequential"] * 2 + ["sequential", "usg"] * 2
    assert [r.system for r in report.results] == ["usg", "usg", "sequential", "sequential"]
    assert all(r.errors == 0 for r in report.results) and sum(len(r.latencies_ms) for r in report.results) > 0
    assert report.equivalence["sequential"].ok
    assert len(bounds) == 4 and set(report.bound["achieved"]) == {"1", "2"}
    assert any("2 rounds per system and level" in n for n in report.notes)
    assert all(len(r.extra["round_rps"]) == 2 for r in report.results)  # one throughput per round
    few = [r for r in report.results if r.completed < 30]
    assert len([n for n in report.notes if "fewer than 30" in n]) == len(few)


def test_requests_long_against_the_round_are_noted(tmp_path: Path):
    p = tmp_path / "slow.yaml"  # each request sleeps 0.2 s: fewer than 3 a client in a 0.3 s round
    p.write_text(GRAPH.replace('"testops:upper", inputs:', '"testops:sleepy", options: {seconds: 0.2}, inputs:'))
    cfg = BenchConfig("slow.yaml", concurrency=(2,), duration_s=0.3, warmup_s=0.0, samples=[Sample("a", text="hi")])
    report = asyncio.run(run_bench(cfg, load_graph(p)))
    notes = [n for n in report.notes if n.startswith("usg@c2: its requests took")]
    assert len(notes) == 1 and "in 0.3 s rounds" in notes[0] and "raise --duration" in notes[0]


def test_compare_without_a_graph_is_refused():
    with pytest.raises(UsageError, match="--compare needs the graph"):
        asyncio.run(run_bench(BenchConfig("http://127.0.0.1:1", compare=("sequential",)), None))


class IdleCostly:
    """A baseline that keeps processes busy while idle (as a private Ray): it must be up only for its runs."""

    name = "costly"
    idle_cpu = True

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.up = False

    async def start(self) -> None:
        self.events.append("start")
        self.up = True

    async def infer(self, sample: Sample) -> dict[str, str]:
        assert self.up, "load sent to a stopped baseline"
        await asyncio.sleep(0.001)
        return {"shout": (sample.text or "").upper()}

    async def aclose(self) -> None:
        if self.up:
            self.events.append("stop")
        self.up = False


def test_a_baseline_with_idle_cpu_is_up_only_for_its_own_runs(graph, monkeypatch):
    import usg.bench.baselines as baselines

    events: list[str] = []
    target = IdleCostly(events)
    monkeypatch.setattr(baselines, "make_baseline", lambda name, graph, workers: target)

    def progress(system: str, level: str, _total: float):
        events.append(f"run {system}")
        return None

    cfg = BenchConfig(
        "shout.yaml",
        concurrency=(1,),
        duration_s=0.2,
        warmup_s=0.0,
        compare=("costly",),
        rounds=2,
        samples=[Sample("a", text="hello")],
    )
    report = asyncio.run(run_bench(cfg, graph, progress=progress))
    assert events == [
        "start",
        "stop",  # started for the output check, then stopped while USG runs
        "run usg",
        "run costly",
        "start",
        "stop",
        "run costly",
        "start",
        "stop",
        "run usg",
    ]
    assert report.equivalence["costly"].ok and not target.up
    assert any("started before each of its runs" in n for n in report.notes)
