"""The executor's cap on single-threaded CPU model calls in flight, across models."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from usg.graph import BatchPolicy, GraphBuilder
from usg.runtime import Executor
from usg.runtime.cpu_gate import CpuGate, output_ranks, usable_cores
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


def graph(concurrency: int = 3):  # type: ignore[no-untyped-def]
    return (
        GraphBuilder("gate")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("a", "python", options={"callable": "testops:identity", "concurrency": concurrency})
        .model(
            "b",
            "python",
            options={"callable": "testops:identity", "concurrency": concurrency},
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


def test_the_gate_stands_aside_when_the_models_calls_cannot_outnumber_the_slots() -> None:
    """a and b run one call each: on 2 slots no call could ever wait, so none goes through the gate
    (speech-stream's silero, 2 calls on 2 cores); on 1 slot the gate holds them to one at a time."""
    for slots, idle, peak in ((2, True, 2), (1, False, 1)):
        running = Running(block_until=2 if idle else 0)  # idle: show the two calls do overlap
        backends = {"a": running.backend(), "b": running.backend()}
        with Executor(graph(concurrency=1), backends=backends, cpu_slots=slots) as ex:
            ex.infer_sync({"x": np.ones((1, 2), np.float32)})
            assert ex.cpu_gate.idle is idle
            assert sum(ex.cpu_gate.calls.values()) == (0 if idle else 12)
        assert running.peak == peak, slots
    gate = CpuGate(2)
    gate.fit({"a": 2, "b": 1})
    assert not gate.idle and gate.applies(Cpu())  # type: ignore[arg-type]


def test_the_gate_is_on_by_default_with_the_usable_cores_and_0_turns_it_off() -> None:
    assert CpuGate().slots == usable_cores() >= 1
    assert Executor(graph()).cpu_gate.slots == usable_cores()
    assert Executor(graph(), cpu_slots=0).cpu_gate.slots == 0


class Cpu:
    """A stand-in for a single-threaded CPU session (the gate only reads these two flags)."""

    cpu_in_caller = True
    remote = False


def test_a_freed_slot_goes_to_the_model_nearest_the_output_then_first_come() -> None:
    async def main() -> tuple[list[str], CpuGate]:
        gate = CpuGate(1, {"det": 11, "cls": 7, "rec": 5})
        order: list[str] = []
        release = asyncio.Event()

        async def call(model: str, block: bool = False) -> None:
            async with gate.hold(Cpu(), model):  # type: ignore[arg-type]
                order.append(model)
                if block:
                    await release.wait()

        first = asyncio.create_task(call("rec", block=True))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(call(m)) for m in ("det", "det", "cls", "rec")]
        await asyncio.sleep(0)
        assert order == ["rec"] and gate.running == 1  # all four wait: a rec runs, the only slot
        release.set()
        await asyncio.gather(first, *waiting)
        return order, gate

    order, gate = asyncio.run(main())
    assert order == ["rec", "rec", "cls", "det", "det"]
    assert gate.running == 0 and gate.peak == 1
    assert gate.waited == {"det": 2, "cls": 1, "rec": 1}
    # rec went past det and cls (earlier), cls past det; the dets overtook nobody
    assert gate.overtook == {"rec": 1, "cls": 1}


def test_calls_further_up_never_hold_a_later_step_back() -> None:
    async def main() -> tuple[list[str], CpuGate]:
        gate = CpuGate(1, {"det": 11, "rec": 5})
        order: list[str] = []
        done = {m: asyncio.Event() for m in ("det", "rec")}

        async def call(model: str, until: str | None) -> None:
            async with gate.hold(Cpu(), model):  # type: ignore[arg-type]
                order.append(model)
                if until is not None:
                    await done[until].wait()

        det = asyncio.create_task(call("det", "det"))
        await asyncio.sleep(0)
        rec = asyncio.create_task(call("rec", "rec"))  # det holds the slot: rec starts anyway
        det2 = asyncio.create_task(call("det", None))  # two run: det waits for a free core
        await asyncio.sleep(0)
        assert order == ["det", "rec"] and gate.running == 2
        done["rec"].set()
        await rec
        assert order == ["det", "rec"]  # one core still busy with det
        done["det"].set()
        await asyncio.gather(det, det2)
        return order, gate

    order, gate = asyncio.run(main())
    assert order == ["det", "rec", "det"]
    assert gate.peak == 2 and gate.running == 0 and gate.waited == {"det": 1}


def test_a_waiter_cancelled_before_or_after_its_grant_does_not_leak_the_slot() -> None:
    async def main() -> CpuGate:
        gate = CpuGate(1, {"a": 0, "b": 1})
        hold = asyncio.Event()

        async def call(model: str) -> None:
            async with gate.hold(Cpu(), model):  # type: ignore[arg-type]
                await hold.wait()

        first = asyncio.create_task(call("a"))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(call("a"))
        later = asyncio.create_task(call("b"))
        await asyncio.sleep(0)
        cancelled.cancel()  # while it waits
        hold.set()
        await asyncio.gather(first, later, cancelled, return_exceptions=True)
        assert gate.running == 0 and not gate._waiting
        # cancelled in the same turn as its grant: the slot passes on
        hold.clear()
        holder = asyncio.create_task(call("a"))
        await asyncio.sleep(0)
        granted = asyncio.create_task(call("a"))
        after = asyncio.create_task(call("b"))
        await asyncio.sleep(0)
        hold.set()
        await asyncio.sleep(0)  # the holder leaves and grants "a" its slot
        granted.cancel()
        await asyncio.gather(holder, granted, after, return_exceptions=True)
        return gate

    gate = asyncio.run(main())
    assert gate.running == 0 and gate.peak == 1 and not gate._waiting
    assert gate.waited == {"b": 2}  # neither "a" ran: one left the queue, one passed its slot on


def test_output_ranks_put_each_model_below_the_models_upstream_of_it() -> None:
    g = (
        GraphBuilder("chain")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("first", "python", options={"callable": "testops:identity"})
        .model("second", "python", options={"callable": "testops:identity"})
        .model("shared", "python", options={"callable": "testops:identity"})
        .node("n1", model="first", inputs={"x": "inputs.x"})
        .node("n2", model="second", inputs={"x": "n1.y"})
        .node("early", model="shared", inputs={"x": "inputs.x"})
        .node("late", model="shared", inputs={"x": "n2.y"})
        .output("a", "late.y")
        .output("b", "early.y")
        .build()
    )
    # a model used at two places ranks by its node nearest the output
    assert output_ranks(g) == {"first": 2, "second": 1, "shared": 0}
    assert Executor(g, cpu_slots=2).cpu_gate.ranks == output_ranks(g)


def test_metrics_show_the_gate_slots_ranks_and_waits() -> None:
    from usg.serve.metrics import ServeMetrics

    async def main() -> CpuGate:
        gate = CpuGate(1, {"det": 2, "rec": 0})
        hold = asyncio.Event()

        async def call(model: str) -> None:
            async with gate.hold(Cpu(), model):  # type: ignore[arg-type]
                await hold.wait()

        tasks = [asyncio.create_task(call("rec"))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(call(m)) for m in ("det", "rec")]
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(*tasks)
        return gate

    metrics = ServeMetrics()
    metrics.bind_gate(asyncio.run(main()))
    text = metrics.render().decode()
    assert "usg_cpu_gate_slots 1.0" in text
    assert 'usg_cpu_gate_rank{model="rec"} 0.0' in text and 'usg_cpu_gate_rank{model="det"} 2.0' in text
    assert 'usg_cpu_gate_calls_total{model="rec"} 2.0' in text
    assert 'usg_cpu_gate_waited_calls_total{model="det"} 1.0' in text
    assert 'usg_cpu_gate_overtakes_total{model="rec"} 1.0' in text
    assert 'usg_cpu_gate_overtakes_total{model="det"} 0.0' in text
