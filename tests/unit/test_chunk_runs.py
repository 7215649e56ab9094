"""Executor.run_chunk (a session's lean chunk run) against Executor.infer on the same stream:
the same outputs, pruned nodes, observer records, errors and deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from usg.errors import InputError, RequestTimeout, USGError
from usg.graph import GraphBuilder
from usg.graph.model import BatchPolicy
from usg.graph.state import StateSpec
from usg.records import NodeEvent
from usg.runtime import Executor, Observer
from usg.runtime.streams import StreamState
from usg.specs import AudioSpec, TensorSpec
from usg.testing import FakeBackend

RATE = 16_000


def counter(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A stateful fake: output = the window's mean level plus the windows this stream saw before."""
    x, state = inputs["input"], inputs["state"]
    new = state.copy()
    new[0, :, 0] += 1
    level = np.abs(x[:, 64:]).mean(axis=1, keepdims=True) + state[0, :, :1]
    return {"output": level.astype(np.float32), "stateN": new}


def _fake(handler: Any = counter) -> FakeBackend:
    return FakeBackend(
        handler,
        {
            "input": TensorSpec("float32", (None, 576)),
            "state": TensorSpec("float32", (2, None, 128)),
            "sr": TensorSpec("int64", ()),
        },
        {"output": TensorSpec("float32", (None, 1)), "stateN": TensorSpec("float32", (2, None, 128))},
    )


def _graph() -> Any:
    return (
        GraphBuilder("chunks")
        .input("audio", "audio", audio=AudioSpec(sample_rate=RATE, channels=1, max_seconds=60))
        .input("note", "text", optional=True)
        .model("vad", "python", batch=BatchPolicy(max_size=8, max_delay_ms=2), state=StateSpec({"state": "stateN"}, 1))
        .node("windows", fn="usg.ops.vad_stream:vad_windows", inputs={"audio": "inputs.audio"})
        .node("vad", model="vad", map=["input"], inputs={"input": "windows.frames", "sr": "windows.sr"})
        .node("level", fn="testops:chunk_level", inputs={"audio": "inputs.audio"})
        .node("db", fn="testops:level_db", inputs={"level": "level.level", "seen": "level.seen"})
        .node("shout", fn="testops:upper", inputs={"text": "inputs.note"})
        .output("probs", "vad.output")
        .output("seen", "level.seen")
        .output("ts", "level.ts")
        .output("flush", "level.flush")
        .output("db", "db.db")
        .output("shout", "shout.text")
        .build()
    )


class Recorder(Observer):
    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def request_started(self, request_id: str, modalities: Sequence[str]) -> None:
        self.records.append(("started", request_id, tuple(modalities)))

    def request_integrity(self, request_id: str, integrity: Mapping[str, str]) -> None:
        self.records.append(("integrity", request_id, dict(integrity)))

    def node_finished(self, event: NodeEvent) -> None:
        self.records.append(("node", event.request_id, event.node, event.kind, event.model, event.items, event.ok))

    def request_values(self, request_id: str, inputs: Mapping[str, Any], nodes: Mapping[str, Any]) -> None:
        self.records.append(
            ("values", request_id, sorted(inputs), sorted(k for k, v in nodes.items() if v is not None))
        )

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        self.records.append(("finished", request_id, tuple(modalities), status, tuple(pruned)))


def _chunks() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    sizes = [300, 512, 1000, 40, 2048, 700, 512]
    out = []
    for i, n in enumerate(sizes):
        x = rng.uniform(-0.3, 0.3, n).astype(np.float32)
        if i in (1, 4):
            x[:] = 0.0  # quiet: the level node says "nothing here" and db is skipped
        out.append(x)
    return out


async def _stream(ex: Executor, lean: bool, chunks: list[np.ndarray]) -> list[Any]:
    state = StreamState(flush=False, sequential=True)
    results: list[Any] = []
    for i, x in enumerate([*chunks, np.zeros(0, np.float32)]):
        state.ts_ms, state.flush = 1000.0 + 32 * i, x.size == 0
        rid = f"s:{i}"
        try:
            if lean:
                r = await ex.run_chunk({"audio": x}, state, rid)
            else:
                r = await ex.infer({"audio": x}, stream=state, request_id=rid)
        except USGError as exc:
            results.append((type(exc).__name__, str(exc), exc.node, exc.to_dict()))
            continue
        results.append((_plain(r.outputs), r.pruned_nodes, sorted(r.node_ms), r.request_id, r.integrity))
    return results


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.tolist())
    return value


def _both(chunks: list[np.ndarray], handler: Any = counter) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    async def run(lean: bool) -> tuple[list[Any], list[Any]]:
        rec = Recorder()
        async with Executor(_graph(), backends={"vad": _fake(handler)}, observers=[rec]) as ex:
            return await _stream(ex, lean, chunks), rec.records

    (slow, slow_rec), (lean, lean_rec) = asyncio.run(run(False)), asyncio.run(run(True))
    return slow, lean, slow_rec, lean_rec


def test_a_chunk_run_gives_what_infer_gives() -> None:
    slow, lean, slow_rec, lean_rec = _both(_chunks())
    assert lean == slow
    assert lean_rec == slow_rec
    quiet, one = ["shout", "db"], ["shout"]  # pruned: no note; db skipped after a quiet chunk
    assert [r[1] for r in lean] == [one, quiet, one, one, quiet, one, one, quiet]
    assert [r[0]["seen"] for r in lean] == list(range(1, 9))  # the op's session_state lived on
    assert [r[0]["ts"] for r in lean] == [1000.0 + 32 * i for i in range(8)]
    assert [r[0]["flush"] for r in lean] == [False] * 7 + [True]
    assert "db" not in lean[1][0] and lean[0][0]["db"] < 0
    # the model's state was carried window after window: each saw the stream's windows before it
    counts = [int(p[1][0][0]) for r in lean for p in r[0]["probs"]]
    assert counts == list(range(len(counts))) and len(counts) == 10
    assert ("node", "s:0", "vad", "model", "vad", 0, True) in lean_rec  # a chunk too short for a window
    assert ("finished", "s:1", ("audio",), "ok", ("shout", "db")) in lean_rec


def test_a_failing_node_and_model_fail_the_same_way() -> None:
    chunks = _chunks()
    chunks[2][0] = 0.75  # testops:chunk_level raises on this chunk

    def blows_up_once(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if float(np.abs(inputs["input"][:, 64:]).max()) > 0.95:
            raise ValueError("model blew up")
        return counter(inputs)

    chunks[5][100] = 0.99  # and the model on this one
    slow, lean, slow_rec, lean_rec = _both(chunks, blows_up_once)
    assert lean == slow and lean_rec == slow_rec
    name, message, node, _ = lean[2]
    assert (name, node) == ("BackendError", "level")
    assert "node 'level' (fn testops:chunk_level) raised ValueError: marker sample" in message
    assert lean[5][0] == "BackendError" and lean[5][2] == "vad" and "model blew up" in lean[5][1]
    assert isinstance(lean[6][0], dict)  # the stream went on


def test_inputs_a_chunk_run_cannot_take_go_through_infer() -> None:
    async def run() -> list[str]:
        async with Executor(_graph(), backends={"vad": _fake()}) as ex:
            state = StreamState(flush=False, sequential=True)
            errors = []
            for inputs in ({"note": "hi"}, {"video": b"x"}, {}):
                with pytest.raises(InputError) as info:
                    await ex.run_chunk(inputs, state, "r")
                errors.append(str(info.value))
            both = await ex.run_chunk({"audio": np.zeros(512, np.float32), "note": "hi"}, state, "r2")
            assert both.outputs["shout"] == "HI" and both.pruned_nodes == ["db"]
            return errors

    errors = asyncio.run(run())
    assert "required input 'audio' (audio) is missing" in errors[0]
    assert "unknown input(s) 'video'" in errors[1]
    assert "no inputs given" in errors[2] or "required input 'audio'" in errors[2]


def test_a_chunk_past_the_deadline_times_out_and_the_stream_goes_on() -> None:
    def slow_once(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if float(np.abs(inputs["input"][:, 64:]).max()) > 0.95:
            import time

            time.sleep(1.0)
        return counter(inputs)

    async def run() -> tuple[str, dict[str, Any], int, int]:
        async with Executor(_graph(), backends={"vad": _fake(slow_once)}, timeout_s=0.3) as ex:
            state = StreamState(flush=False, sequential=True)
            x = np.full(512, 0.99, np.float32)
            with pytest.raises(RequestTimeout) as info:
                await ex.run_chunk({"audio": x}, state, "s:1")
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0  # the timeout's cancel was taken back
            await asyncio.sleep(1.0)  # the stuck call returns
            ok = await ex.run_chunk({"audio": np.full(512, 0.2, np.float32)}, state, "s:2")
            return str(info.value), ok.outputs, ex.inflight, len(ex._deadlines._runs)

    message, outputs, inflight, runs = asyncio.run(run())
    assert "request s:1 did not finish within 0.3 s" in message
    assert outputs["seen"] == 2 and inflight == 0 and runs == 0


def test_a_cancelled_chunk_run_is_cancelled_not_timed_out() -> None:
    async def run() -> tuple[bool, int]:
        def stuck(inputs: Mapping[str, Any]) -> dict[str, Any]:
            import time

            time.sleep(0.5)
            return counter(inputs)

        async with Executor(_graph(), backends={"vad": _fake(stuck)}, timeout_s=30) as ex:
            state = StreamState(flush=False, sequential=True)
            task = asyncio.create_task(ex.run_chunk({"audio": np.full(512, 0.2, np.float32)}, state, "s:1"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.6)
            return task.cancelled(), len(ex._deadlines._runs)

    cancelled, runs = asyncio.run(run())
    assert cancelled and runs == 0


def test_a_node_that_ran_without_the_port_an_output_reads_fails_the_chunk_as_it_fails_infer() -> None:
    """The lean chunk run answered {} where infer raises (the node returned {"nope": ...})."""
    graph = (
        GraphBuilder("wrong")
        .input("text", "text")
        .node("n", fn="testops:wrong_port", inputs={"text": "inputs.text"})
        .output("y", "n.text")
        .build()
    )

    async def run(lean: bool) -> str:
        async with Executor(graph) as ex:
            state = StreamState(flush=False, sequential=True)
            with pytest.raises(USGError) as info:
                if lean:
                    await ex.run_chunk({"text": "x"}, state, "s:1")
                else:
                    await ex.infer({"text": "x"}, stream=state, request_id="s:1")
            return f"{type(info.value).__name__}: {info.value}"

    lean, slow = asyncio.run(run(True)), asyncio.run(run(False))
    assert lean == slow
    assert "node 'n' returned no output 'text' (it returned ['nope']), which graph output 'y' reads" in lean
