"""The executor's cap on single-threaded CPU model calls in flight, across models."""

from __future__ import annotations

import threading
import time

import numpy as np

from usg.graph import BatchPolicy, GraphBuilder
from usg.runtime import Executor
from usg.runtime.cpu_gate import CpuGate, usable_cores
from usg.specs import TensorSpec
from usg.testing import FakeBackend


class Running:
    """Counts the backend calls running at once (in worker threads); ``block_until`` holds each
    call until that many run together (or 5 s pass), to show calls *can* overlap."""

    def __init__(self, block_until: int = 0) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.block_until = block_until
        self.enough = threading.Event()

    def backend(self, *, cpu: bool = True) -> FakeBackend:
        def handler(inp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
                if self.block_until and self.now >= self.block_until:
                    self.enough.set()
            if self.block_until:
                self.enough.wait(timeout=5)
            else:
                time.sleep(0.01)
            with self.lock:
                self.now -= 1
            return {"y": inp["x"] * 2}

        spec = {"x": TensorSpec("float32", ("batch", None))}
        fake = FakeBackend(handler, spec, {"y": TensorSpec("float32", ("batch", None))})
        fake.cpu_in_caller = cpu  # a single-threaded CPU session, as ORT with intra_op_threads 1 reports
        return fake


def graph():  # type: ignore[no-untyped-def]
    return (
        GraphBuilder("gate")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("a", "python", options={"callable": "testops:identity", "concurrency": 3})
        .model(
            "b",
            "python",
            options={"callable": "testops:identity", "concurrency": 3},
            batch=BatchPolicy(max_size=1, max_delay_ms=0),
        )
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 6})
        .node("da", model="a", map=True, inputs={"x": "split.items"})
        .node("db", model="b", map=True, inputs={"x": "split.items"})
        .output("a", "da.y")
        .output("b", "db.y")
        .build()
    )


def test_cpu_bound_calls_of_all_models_share_one_slot_per_core() -> None:
    running = Running()
    backends = {"a": running.backend(), "b": running.backend()}
    with Executor(graph(), backends=backends, cpu_slots=2) as ex:
        r = ex.infer_sync({"x": np.ones((1, 2), np.float32)})
        assert ex.cpu_gate.peak == 2
    assert len(r.outputs["a"]) == len(r.outputs["b"]) == 6
    assert running.peak == 2  # 3 + 3 allowed by the models' concurrency, 2 cores


def test_without_the_cap_or_for_multithreaded_sessions_calls_overlap_as_declared() -> None:
    for slots, cpu in ((0, True), (2, False)):
        running = Running(block_until=3)
        backends = {"a": running.backend(cpu=cpu), "b": running.backend(cpu=cpu)}
        with Executor(graph(), backends=backends, cpu_slots=slots) as ex:
            ex.infer_sync({"x": np.ones((1, 2), np.float32)})
            assert ex.cpu_gate.peak == 0
        assert running.peak >= 3, (slots, cpu)


def test_the_gate_is_off_by_default_and_none_means_the_usable_cores() -> None:
    assert CpuGate().slots == usable_cores() >= 1
    assert Executor(graph(), cpu_slots=None).cpu_gate.slots == usable_cores()
    assert Executor(graph()).cpu_gate.slots == 0
