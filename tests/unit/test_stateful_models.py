"""Stateful models with fakes: the state: schema and its checks, stacking on the declared axis, per-stream state."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from usg.errors import GraphError
from usg.graph import GraphBuilder
from usg.graph.loader import parse_graph
from usg.graph.model import BatchPolicy
from usg.graph.state import StateSpec, parse_state, state_problems
from usg.runtime import Executor
from usg.runtime.padding import assemble, group_key, item_rows, split_outputs
from usg.runtime.streams import StreamState
from usg.specs import TensorSpec
from usg.testing import FakeBackend

STATE = StateSpec({"state": "stateN"}, batch_axis=1)
IN_SPECS = {
    "x": TensorSpec("float32", (None, 4)),
    "state": TensorSpec("float32", (2, None, 4)),
    "k": TensorSpec("int64", ()),
}
OUT_SPECS = {"y": TensorSpec("float32", (None, 4)), "stateN": TensorSpec("float32", (2, None, 4))}


def recurrent(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A tiny recurrent model: state[0] accumulates x * k, state[1] counts steps; y = new state[0]."""
    x, state, k = inputs["x"], inputs["state"], int(inputs["k"])
    assert state.shape == (2, x.shape[0], 4), state.shape  # stacked on axis 1, one row per item
    new = state.copy()
    new[0] += x * k
    new[1] += 1
    return {"y": new[0].copy(), "stateN": new}


def test_parse_state_collects_every_problem() -> None:
    spec, problems = parse_state("models.m.state", {"pairs": {"state": 3}, "batch_axis": -1, "init": "ones", "x": 1})
    text = "\n".join(str(p) for p in problems)
    assert spec is not None
    assert "models.m.state.x: unknown key 'x'" in text
    assert "models.m.state.pairs: pairs is {'state': 3}" in text
    assert "batch_axis is -1" in text and "init is 'ones'" in text
    assert parse_state("w", None) == (None, [])
    _, problems = parse_state("w", "zeros")
    assert "state is 'zeros', not a mapping" in str(problems[0])


def test_state_problems_against_the_model_io() -> None:
    assert state_problems("m", STATE, IN_SPECS, OUT_SPECS) == []
    bad = StateSpec({"state": "next", "h": "stateN"}, batch_axis=1)
    text = "\n".join(str(p) for p in state_problems("models.m.state", bad, IN_SPECS, OUT_SPECS))
    assert "the model has no output 'next'" in text and "stateN" in text
    assert "the model has no input 'h'" in text
    axis0 = StateSpec({"state": "stateN"}, batch_axis=0)  # silero's state [2, batch, 128] read as batch-first
    text = str(state_problems("models.m.state", axis0, IN_SPECS, OUT_SPECS)[0])
    assert "fixed size 2 on batch_axis 0" in text and "the axis that grows with the batch" in text
    far = StateSpec({"state": "stateN"}, batch_axis=3)
    assert "batch_axis 3 is outside input 'state' of rank 3" in str(state_problems("m", far, IN_SPECS, OUT_SPECS)[0])


def test_loader_reads_the_state_section() -> None:
    data = {
        "inputs": {"x": {"dtype": "float32", "shape": [None, 4]}},
        "models": {"m": {"backend": "python", "state": {"pairs": {"state": "stateN"}, "batch_axis": 1}}},
        "nodes": {"n": {"model": "m", "inputs": {"x": "inputs.x"}}},
        "outputs": {"y": "n.y"},
    }
    parsed = parse_graph(data, None)
    assert parsed.models["m"].state == STATE
    data["models"]["m"]["state"] = {"pairs": {}, "batch_axis": "one"}
    problems = parse_graph(data, None).problems
    assert {p.where for p in problems} >= {"models.m.state.pairs", "models.m.state.batch_axis"}


def test_assemble_stacks_state_on_its_axis_and_passes_scalars_once() -> None:
    items = [
        {"x": np.full((1, 4), i, np.float32), "state": np.full((2, 1, 4), i, np.float32), "k": np.array(3)}
        for i in range(3)
    ]
    assert item_rows(items[0], STATE) == 1
    batch, _, _ = assemble(items, None, STATE)
    assert batch["state"].shape == (2, 3, 4) and batch["x"].shape == (3, 4)
    assert batch["k"].shape == () and int(batch["k"]) == 3
    out = recurrent(batch)
    parts = split_outputs(out, items, None, batch, STATE)
    for i, part in enumerate(parts):
        assert part["stateN"].shape == (2, 1, 4) and part["stateN"].flags.c_contiguous
        np.testing.assert_array_equal(part["stateN"][1], np.full((1, 4), i + 1))
    # unequal scalars never share a batch
    other = {**items[0], "k": np.array(5)}
    assert group_key(items[0], None) == group_key(items[1], None) != group_key(other, None)


def test_split_names_a_model_that_loses_the_state_batch() -> None:
    items = [{"x": np.zeros((1, 4), np.float32), "state": np.zeros((2, 1, 4), np.float32)} for _ in range(2)]
    batch, _, _ = assemble(items, None, STATE)
    with pytest.raises(ValueError, match="state output 'stateN' \\[2, 1, 4\\] has 1 rows on batch_axis 1"):
        split_outputs({"y": np.zeros((2, 4)), "stateN": np.zeros((2, 1, 4))}, items, None, batch, STATE)


def test_state_is_kept_per_stream_and_batched_across_streams() -> None:
    fake = FakeBackend(recurrent, IN_SPECS, OUT_SPECS)
    graph = (
        GraphBuilder("rec")
        .input("x", "tensor", spec=TensorSpec("float32", (1, 4)))
        .input("k", "tensor", spec=TensorSpec("int64", ()))
        .model("m", "python", batch=BatchPolicy(max_size=8, max_delay_ms=50), state=STATE)
        .node("n", model="m", inputs={"x": "inputs.x", "k": "inputs.k"})
        .output("y", "n.y")
        .build()
    )
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 5, 1, 4)).astype(np.float32)  # 4 streams x 5 chunks

    async def run() -> list[list[np.ndarray]]:
        async with Executor(graph, backends={"m": fake}) as ex:
            streams = [StreamState(flush=False) for _ in range(4)]
            outs: list[list[np.ndarray]] = [[] for _ in range(4)]
            for step in range(5):  # the streams' chunks interleaved, each step one batch of 4
                results = await asyncio.gather(
                    *(ex.infer({"x": xs[s, step], "k": np.array(2)}, stream=streams[s]) for s in range(4))
                )
                for s, r in enumerate(results):
                    outs[s].append(r.outputs["y"])
            assert all(st.models["n"]["state"].shape == (2, 1, 4) for st in streams)
            return outs

    outs = asyncio.run(run())
    assert max(len(c["x"]) for c in fake.calls) == 4  # chunks of the 4 streams shared calls
    for s in range(4):  # equal to each stream alone, step by step
        state = np.zeros((2, 1, 4), np.float32)
        for step in range(5):
            ref = recurrent({"x": xs[s, step], "state": state, "k": np.array(2)})
            state = ref["stateN"]
            np.testing.assert_allclose(outs[s][step], ref["y"], atol=1e-6)


def test_a_request_is_a_stream_of_its_own_and_the_state_output_is_not_an_output() -> None:
    fake = FakeBackend(recurrent, IN_SPECS, OUT_SPECS)
    graph = (
        GraphBuilder("rec")
        .input("x", "tensor", spec=TensorSpec("float32", (1, 4)))
        .input("k", "tensor", spec=TensorSpec("int64", ()))
        .model("m", "python", state=STATE)
        .node("n", model="m", inputs={"x": "inputs.x", "k": "inputs.k"})
        .output("y", "n.y")
        .build()
    )
    with Executor(graph, backends={"m": fake}) as ex:
        a = ex.infer_sync({"x": np.ones((1, 4), np.float32), "k": np.array(1)}).outputs["y"]
        b = ex.infer_sync({"x": np.ones((1, 4), np.float32), "k": np.array(1)}).outputs["y"]
    np.testing.assert_array_equal(a, b)  # each request starts from init: zeros


def test_executor_checks_the_state_against_the_loaded_backend() -> None:
    fake = FakeBackend(recurrent, IN_SPECS, {"y": OUT_SPECS["y"]})  # no stateN output
    graph = (
        GraphBuilder("rec")
        .input("x", "tensor", spec=TensorSpec("float32", (1, 4)))
        .input("k", "tensor", spec=TensorSpec("int64", ()))
        .model("m", "python", state=STATE)
        .node("n", model="m", inputs={"x": "inputs.x", "k": "inputs.k"})
        .output("y", "n.y")
        .build()
    )
    ex = Executor(graph, backends={"m": fake})
    with pytest.raises(GraphError, match=r"models\.m\.state\.pairs\.state: the model has no output 'stateN'"):
        ex.start_sync()
    ex.close()
