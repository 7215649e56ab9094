"""Executor logic on fake backends: pruning, fan-out order, sharing a model, contracts, timeouts."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from usg.errors import BackendError, ContractError, InputError, PayloadTooLarge, RequestTimeout, StateError
from usg.graph import BatchPolicy, GraphBuilder
from usg.runtime import Executor, ExecutorState
from usg.specs import TensorSpec
from usg.testing import FakeBackend


def doubler() -> FakeBackend:
    return FakeBackend(
        lambda inp: {"y": inp["x"] * 2},
        input_specs={"x": TensorSpec("float32", ("batch", None))},
        output_specs={"y": TensorSpec("float32", ("batch", None))},
    )


def two_branch_graph():
    return (
        GraphBuilder("two")
        .input("text", "text", optional=True)
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)), optional=True)
        .model("m", "python", options={"callable": "testops:identity"})
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .node("len", fn="testops:length", inputs={"text": "up.text"})
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 4})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .node("dbl_len", model="m", inputs={"x": "len.n"})
        .output("upper", "up.text")
        .output("doubled", "dbl.y")
        .output("n2", "dbl_len.y")
        .build()
    )


def test_text_only_request_prunes_the_tensor_branch_transitively():
    fake = doubler()
    with Executor(two_branch_graph(), backends={"m": fake}) as ex:
        r = ex.infer_sync({"text": "abc"})
    assert r.outputs["upper"] == "ABC"
    np.testing.assert_array_equal(r.outputs["n2"], [[6.0]])
    assert "doubled" not in r.outputs
    assert r.pruned_nodes == ["split", "dbl"]
    assert set(r.node_ms) == {"up", "len", "dbl_len"}


def test_fan_out_runs_once_per_item_and_gathers_in_order():
    fake = doubler()
    with Executor(two_branch_graph(), backends={"m": fake}, batching=False) as ex:
        r = ex.infer_sync({"x": np.array([[1.0, 2.0]], np.float32)})
    got = [a.tolist() for a in r.outputs["doubled"]]
    assert got == [[[2.0, 4.0]], [[4.0, 8.0]], [[6.0, 12.0]], [[8.0, 16.0]]]
    assert len(fake.calls) == 4  # direct runner: one call per item
    assert r.pruned_nodes == ["up", "len", "dbl_len"]


def test_one_model_shared_by_two_nodes_uses_one_backend():
    fake = doubler()
    with Executor(two_branch_graph(), backends={"m": fake}, batching=False) as ex:
        r = ex.infer_sync({"x": np.ones((1, 2), np.float32), "text": "hey"})
    assert {"upper", "doubled", "n2"} <= set(r.outputs)
    assert len(fake.calls) == 5  # 4 map items + 1 from dbl_len, same backend


def test_contract_error_names_node_both_shapes_and_the_fix():
    g = (
        GraphBuilder("c")
        .input("image", "image")
        .model("det", "python", options={"callable": "testops:identity"})
        .node("raw", fn="testops:raw_image", inputs={"image": "inputs.image"})
        .node("det", model="det", inputs={"x": "raw.hwc"})
        .output("p", "det.y")
        .build()
    )
    fake = FakeBackend(
        lambda i: {"y": i["x"]}, input_specs={"x": TensorSpec("float32", ("n", 3, "h", "w"), layout="NCHW")}
    )
    with Executor(g, backends={"det": fake}) as ex, pytest.raises(ContractError) as exc:
        ex.infer_sync({"image": np.zeros((32, 48, 3), np.uint8)})
    msg = str(exc.value)
    assert "node 'det' (model 'det') input 'x': got uint8[32, 48, 3]" in msg
    assert "model expects float32 [n,3,h,w] NCHW" in msg
    assert "dtype uint8, expected float32" in msg and "rank 3" in msg
    assert "fix: the model wants float32 NCHW with a batch axis" in msg
    assert exc.value.field == "det.x" and exc.value.status == 422
    assert fake.calls == []  # the backend never saw the bad tensor


def test_wrong_dtype_tensor_input_through_python_api():
    with Executor(two_branch_graph(), backends={"m": doubler()}) as ex:
        with pytest.raises(InputError, match=r"x: float64\[1, 2\] does not match float32 \[1,\?\]"):
            ex.infer_sync({"x": np.ones((1, 2))})
        with pytest.raises(InputError, match="unknown input\\(s\\) 'y'"):
            ex.infer_sync({"y": 1})
        with pytest.raises(InputError, match="no inputs given"):
            ex.infer_sync({})


def test_runtime_none_skips_the_branch_and_the_output_is_absent():
    g = (
        GraphBuilder("n")
        .input("text", "text")
        .node("nothing", fn="testops:nothing", inputs={"text": "inputs.text"})
        .node("up", fn="testops:upper", inputs={"text": "nothing.text"})
        .output("upper", "up.text")
        .output("raw", "nothing.text")
        .build()
    )
    with Executor(g) as ex:
        r = ex.infer_sync({"text": "x"})
    assert r.outputs == {}
    assert r.pruned_nodes == ["up"]


def test_timeout_and_node_errors_are_clear():
    g = (
        GraphBuilder("t")
        .input("text", "text")
        .node("slow", fn="testops:sleepy", inputs={"text": "inputs.text"}, options={"seconds": 2})
        .node("bad", fn="testops:boom", inputs={"text": "inputs.text"})
        .output("a", "slow.text")
        .output("b", "bad.text")
        .build()
    )
    # a failing node fails the request at once: the node's error, not the deadline of the slow branch
    with Executor(g) as ex, pytest.raises(BackendError, match=r"node 'bad' \(fn testops:boom\) raised RuntimeError"):
        ex.infer_sync({"text": "x"}, timeout_s=0.3)

    g2 = (
        GraphBuilder("t2")
        .input("text", "text")
        .node("slow", fn="testops:sleepy", inputs={"text": "inputs.text"}, options={"seconds": 1})
        .output("a", "slow.text")
        .build()
    )
    with Executor(g2) as ex, pytest.raises(RequestTimeout, match=r"did not finish within 0\.2 s"):
        ex.infer_sync({"text": "x"}, timeout_s=0.2)

    g3 = (
        GraphBuilder("t3")
        .input("text", "text")
        .node("bad", fn="testops:boom", inputs={"text": "inputs.text"})
        .output("b", "bad.text")
        .build()
    )
    with (
        Executor(g3) as ex,
        pytest.raises(BackendError, match=r"node 'bad' \(fn testops:boom\) raised RuntimeError: kaboom"),
    ):
        ex.infer_sync({"text": "x"})

    g4 = (
        GraphBuilder("t4")
        .input("text", "text")
        .node("nd", fn="testops:not_a_dict", inputs={"text": "inputs.text"})
        .output("c", "nd.text")
        .build()
    )
    with Executor(g4) as ex, pytest.raises(BackendError, match="returned list; fix: return a dict"):
        ex.infer_sync({"text": "x"})


def test_lifecycle_states_refuse_clearly():
    ex = Executor(two_branch_graph(), backends={"m": doubler()})
    assert ex.state is ExecutorState.NEW
    ex.start_sync()
    assert ex.state is ExecutorState.RUNNING
    ex.close()
    assert ex.state is ExecutorState.CLOSED

    async def after_close():
        with pytest.raises(StateError, match="executor is closed"):
            await ex.infer({"text": "a"})

    asyncio.run(after_close())


def test_async_api_runs_requests_concurrently():
    async def main():
        async with Executor(two_branch_graph(), backends={"m": doubler()}) as ex:
            results = await asyncio.gather(*(ex.infer({"text": f"t{i}"}) for i in range(20)))
        return [r.outputs["upper"] for r in results]

    assert asyncio.run(main()) == [f"T{i}" for i in range(20)]


def test_fan_out_items_spread_across_batches_and_come_back_in_order():
    from usg.graph import BatchPolicy

    g = (
        GraphBuilder("fan")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("m", "python", options={"callable": "testops:identity"}, batch=BatchPolicy(max_size=3, max_delay_ms=20))
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 7})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .output("doubled", "dbl.y")
        .build()
    )
    fake = doubler()
    with Executor(g, backends={"m": fake}) as ex:
        r = ex.infer_sync({"x": np.array([[1.0]], np.float32)})
    assert [float(a[0, 0]) for a in r.outputs["doubled"]] == [2.0 * (i + 1) for i in range(7)]
    assert sorted(c["x"].shape[0] for c in fake.calls) == [1, 3, 3]


def test_map_over_an_empty_list_gives_empty_lists_downstream():
    g = (
        GraphBuilder("empty")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 0})
        .node("each", fn="testops:identity", map=True, inputs={"x": "split.items"})
        .node("again", fn="testops:identity", map=True, inputs={"x": "each.y"})
        .output("ys", "again.y")
        .build()
    )
    with Executor(g) as ex:
        r = ex.infer_sync({"x": np.ones((1, 2), np.float32)})
    assert r.outputs == {"ys": []}
    assert r.pruned_nodes == []


def fan_out_graph(limit: int | None = None, max_queue: int = 256):
    b = (
        GraphBuilder("fan")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model(
            "m",
            "python",
            options={"callable": "testops:identity"},
            batch=BatchPolicy(max_size=16, max_delay_ms=1, max_queue=max_queue),
        )
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 374})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .output("doubled", "dbl.y")
    )
    if limit is not None:
        b = b.limits(max_fanout_items=limit)
    return b.build()


def test_a_fan_out_larger_than_the_model_queue_is_admitted_as_one_request():
    # 374 items (a page with 374 words) into a model whose queue holds 256: not refused as overload
    fake = doubler()
    with Executor(fan_out_graph(), backends={"m": fake}) as ex:
        r = ex.infer_sync({"x": np.ones((1, 2), np.float32)})
    assert len(r.outputs["doubled"]) == 374
    assert sum(c["x"].shape[0] for c in fake.calls) == 374 and max(c["x"].shape[0] for c in fake.calls) == 16


def test_a_fan_out_above_limits_max_fanout_items_is_413_naming_the_key():
    with (
        Executor(fan_out_graph(limit=100), backends={"m": doubler()}) as ex,
        pytest.raises(
            PayloadTooLarge, match=r"node 'dbl' would fan out to 374 items, above .* 100 \(limits\.max_fanout_items\)"
        ) as exc,
    ):
        ex.infer_sync({"x": np.ones((1, 2), np.float32)})
    assert exc.value.status == 413


def text_graph(limit: int | None = None):
    b = (
        GraphBuilder("txt")
        .input("text", "text")
        .model("tok", "python", options={"callable": "testops:identity"})
        .node("t", model="tok", inputs={"text": "inputs.text"})
        .output("ids", "t.input_ids")
    )
    if limit is not None:
        b = b.limits(max_text_chars=limit)
    return b.build()


def test_a_text_above_limits_max_text_chars_is_413_before_tokenizing():
    fake = FakeBackend(lambda inp: {"input_ids": np.zeros((1, 1), np.int64)})
    with Executor(text_graph(limit=10), backends={"tok": fake}) as ex:
        with pytest.raises(
            PayloadTooLarge, match=r"input 'text' has 11 characters, above .* 10 .*limits\.max_text_chars"
        ):
            ex.infer_sync({"text": "x" * 11})
        with pytest.raises(PayloadTooLarge, match=r"input 'text' has 41 bytes"):
            ex.infer_sync({"text": b"x" * 41})  # refused before decoding
        with pytest.raises(InputError, match=r"unpaired surrogate '\\ud800' at position 1"):
            ex.infer_sync({"text": "a\ud800"})
        assert ex.infer_sync({"text": "x" * 10}).outputs["ids"].shape == (1, 1)
    assert len(fake.calls) == 1


def test_tokenizer_calls_run_concurrently(tmp_path):
    # a long text in one worker thread must not hold up another request's tokenizer call: two
    # calls wait for each other at a barrier, which only works if both are in flight at once
    tokenizers = pytest.importorskip("tokenizers")
    import threading

    from usg.backends.tokenizer import TokenizerBackend

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "[PAD]": 1, "x": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    barrier = threading.Barrier(2, timeout=10)

    class Meeting(TokenizerBackend):
        def infer(self, inputs):
            barrier.wait()
            return super().infer(inputs)

    g = text_graph(limit=100_000)
    long_text = "x " * 15_000  # 30,000 characters: tokenized in a worker thread, not on the loop
    with Executor(g, backends={"tok": Meeting(path, name="tok")}) as ex, ThreadPoolExecutor(2) as callers:
        a, b = callers.map(lambda _: ex.infer_sync({"text": long_text}), range(2))
    assert a.outputs["ids"].shape == b.outputs["ids"].shape == (1, 512)  # truncated to max_length


def test_options_call_timeout_ms_fails_a_hanging_call_naming_the_graph_key():
    import threading

    release = threading.Event()

    def handler(inp):
        if (inp["x"] < 0).any():
            release.wait(6.0)  # hangs "6 s" (released at the end of the test)
        return {"y": inp["x"] * 2}

    fake = FakeBackend(
        handler, {"x": TensorSpec("float32", ("batch", None))}, {"y": TensorSpec("float32", ("batch", None))}
    )
    g = (
        GraphBuilder("hang")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("m", "python", options={"callable": "testops:identity", "call_timeout_ms": 200})
        .node("dbl", model="m", inputs={"x": "inputs.x"})
        .output("y", "dbl.y")
        .build()
    )
    try:
        with Executor(g, backends={"m": fake}) as ex:
            with pytest.raises(
                BackendError, match=r"call_timeout_ms=200.*fix: raise models\.m\.options\.call_timeout_ms"
            ):
                ex.infer_sync({"x": -np.ones((1, 2), np.float32)})
            # the model's only slot was freed at the deadline: the next request is answered
            assert ex.infer_sync({"x": np.ones((1, 2), np.float32)}).outputs["y"].tolist() == [[2.0, 2.0]]
    finally:
        release.set()


def _one_node(fn: str, model: bool = False):
    b = GraphBuilder("g").input("text", "text")
    if model:
        b.model("m", "python", options={"callable": fn})
        b.node("n", model="m", inputs={"x": "inputs.text"})
        b.output("y", "n.y")
    else:
        b.node("n", fn=fn, inputs={"text": "inputs.text"})
        b.output("y", "n.text")
    return b.build()


def test_a_node_that_ran_without_the_port_an_output_reads_is_an_error_not_an_absent_output():
    """{"nope": ...} from a node whose 'text' the graph's output reads: the answer came back without it."""
    with Executor(_one_node("testops:wrong_port")) as ex, pytest.raises(BackendError) as info:
        ex.infer_sync({"text": "x"})
    assert "node 'n' returned no output 'text' (it returned ['nope']), which graph output 'y' reads" in str(info.value)


def test_an_output_json_cannot_carry_is_named_when_the_answer_is_written():
    with Executor(_one_node("testops:an_object")) as ex:
        result = ex.infer_sync({"text": "x"})
    with pytest.raises(BackendError, match=r"output 'y' is a object, which JSON cannot carry; fix:"):
        result.to_json_dict()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fn", "model"), [("testops:exits", False), ("testops:interrupts", True)])
def test_sys_exit_in_a_node_is_that_requests_error_and_the_executor_goes_on(fn: str, model: bool):
    """SystemExit / KeyboardInterrupt raised in a node's code stopped the executor's loop: the request,
    and every later one, waited forever (usg run hung)."""
    with Executor(_one_node(fn, model)) as ex:
        for _ in range(2):
            with pytest.raises(BackendError, match=r"raised (SystemExit: 3|KeyboardInterrupt)"):
                ex.infer_sync({"text": "x"})
