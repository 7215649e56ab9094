"""Arrays a process only sends are not computed there (usg.runtime.deferral, usg.ops.wire).

The Ray engine's router sends det's float32 input to det's replica as the uint8 page it is
computed from; the router itself never reads it. These tests run the real det pre-processing
with a stand-in for det (a fake backend marked remote and shipping derived values, as the router's
RayModelBackend is)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

from usg.errors import ContractError, DeferredValueRead
from usg.graph import GraphBuilder
from usg.graph.model import Graph
from usg.ops.ocr import det_preprocess, rec_preprocess
from usg.ops.wire import deferring, is_placeholder, materialize
from usg.runtime import Executor
from usg.testing import FakeBackend

pytest.importorskip("rapidocr_onnxruntime")


def page(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("hw", [(1000, 1000), (735, 1300), (20, 600), (50, 2500), (2000, 200), (31, 31), (1234, 567)])
def test_a_deferred_det_input_has_the_shape_and_travels_as_the_values(hw: tuple[int, int]) -> None:
    full = det_preprocess(page(*hw))["x"]
    with deferring():
        lazy = det_preprocess(page(*hw))["x"]
    assert is_placeholder(lazy) and not is_placeholder(full)
    assert (lazy.shape, lazy.dtype, lazy.nbytes) == (full.shape, full.dtype, full.nbytes)
    assert np.array_equal(pickle.loads(pickle.dumps(lazy)), full)  # what the replica gets
    assert np.array_equal(materialize({"x": [lazy]})["x"][0], full)


def test_deferred_rec_items_have_their_shapes() -> None:
    crops = [page(30, 200), page(48, 900), page(20, 40)]
    cls = [np.array([[0.9, 0.1]], np.float32)] * 3
    full = rec_preprocess(crops, cls)["items"]
    with deferring():
        lazy = rec_preprocess(crops, cls)["items"]
    assert [x.shape for x in lazy] == [x.shape for x in full]
    assert all(is_placeholder(x) for x in lazy)
    assert all(np.array_equal(pickle.loads(pickle.dumps(a)), b) for a, b in zip(lazy, full, strict=True))


class Remote(FakeBackend):
    remote = True  # as the Ray router's RayModelBackend
    ships_derived = True


def det_graph(*, export_x: bool = False) -> Graph:
    b = (
        GraphBuilder("d")
        .input("image", "image")
        .model("det", "python", options={"callable": "testops:identity"})
        .node("det_pre", fn="usg.ops.ocr:det_preprocess", inputs={"image": "inputs.image"})
        .node("det", model="det", inputs={"x": "det_pre.x"})
        .output("seen", "det.seen")
    )
    if export_x:
        b = b.output("x", "det_pre.x")
    return b.build()


def run(g: Graph, backend: FakeBackend, image: np.ndarray) -> dict[str, Any]:
    with Executor(g, backends={"det": backend}, cache=False) as ex:
        return dict(ex.infer_sync({"image": image}).outputs)


def seen(inputs: Any) -> dict[str, Any]:
    x = inputs["x"]
    return {"seen": np.array([is_placeholder(x)])}


def test_only_remote_readers_get_a_placeholder() -> None:
    image = page(600, 900)
    expected = det_preprocess(image)["x"]
    remote, local = Remote(seen), FakeBackend(seen)
    assert run(det_graph(), remote, image)["seen"].tolist() == [True]
    sent = remote.calls[0]["x"]
    assert sent.shape == expected.shape and np.array_equal(pickle.loads(pickle.dumps(sent)), expected)
    assert run(det_graph(), local, image)["seen"].tolist() == [False]  # a local model reads the values
    assert np.array_equal(local.calls[0]["x"], expected)
    # a graph output is sent to the client: computed, even though the only model reading it is remote
    out = run(det_graph(export_x=True), Remote(seen), image)
    assert not is_placeholder(out["x"]) and np.array_equal(out["x"], expected)


def test_a_remote_model_that_is_sent_the_tensor_itself_gets_the_values() -> None:
    """A Triton BLS call (remote, but the tensor itself crosses) reads the values: no placeholder."""

    class Sent(FakeBackend):
        remote = True

    image = page(600, 900)
    backend = Sent(seen)
    assert run(det_graph(), backend, image)["seen"].tolist() == [False]
    assert np.array_equal(backend.calls[0]["x"], det_preprocess(image)["x"])


def test_nothing_is_deferred_while_an_observer_reads_node_values() -> None:
    from usg.runtime.observer import Observer

    class Reader(Observer):
        def __init__(self) -> None:
            self.x: Any = None

        def request_values(self, request_id: str, inputs: Any, nodes: Any) -> None:
            self.x = nodes["det_pre"]["x"]

    image, reader = page(300, 500), Reader()
    with Executor(det_graph(), backends={"det": Remote(seen)}, cache=False) as ex:
        ex.observers.append(reader)  # added after start, as a server adds its monitor
        assert ex.infer_sync({"image": image}).outputs["seen"].tolist() == [False]
    assert np.array_equal(reader.x, det_preprocess(image)["x"])


# -- a placeholder's values are not there: reading them fails loudly, naming where it came from --

READS = {
    "arithmetic": lambda x: x + 1,
    "a reduction": lambda x: x.mean(),
    "indexing": lambda x: x[0],
    "a numpy function": lambda x: np.stack([x]),
    "bytes": lambda x: x.tobytes(),
    "a reshape": lambda x: x.reshape(-1),
    "iteration": lambda x: list(x),
    "a copy made to send": lambda x: pickle.dumps(copy.copy(x)),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_remote_model_that_reads_a_placeholder_here_fails_naming_the_node_and_port(read: str) -> None:
    """On the old placeholder every read here gave zeros (a mean of 0.0, zero bytes) and no error."""

    def reads_here(inputs: Any) -> dict[str, Any]:
        READS[read](inputs["x"])
        return {"seen": np.array([True])}

    with pytest.raises(DeferredValueRead, match=r"node 'det_pre' port 'x'.*shape \(1, 3, .*fix: ") as info:
        run(det_graph(), Remote(reads_here), page(300, 500))
    assert info.value.status == 500 and info.value.node == "det"


def test_a_node_that_reads_its_own_placeholder_fails_naming_the_node() -> None:
    def pre_and_peek(image: np.ndarray, **options: Any) -> dict[str, Any]:
        out = det_preprocess(image, **options)
        out["x"].max()  # inside usg.ops.wire.deferring: x has no values here
        return out

    g, backends, fns = det_graph(), {"det": Remote(seen)}, {"det_pre": pre_and_peek}
    match = r"from node 'det_pre' \(derived from _det_input\) were read \(attribute \.max\)"
    with Executor(g, backends=backends, fns=fns, cache=False) as ex, pytest.raises(DeferredValueRead, match=match):
        ex.infer_sync({"image": page(300, 500)})


def test_what_a_placeholder_may_be_asked_still_answers() -> None:
    """Shape, dtype, size, repr and the trip to the replica (the contract checks, payload sizes, Ray)."""
    image = page(400, 700)
    full = det_preprocess(image)["x"]
    with deferring("node 'p'"):
        lazy = det_preprocess(image)["x"]
    assert (lazy.shape, lazy.dtype, lazy.ndim, lazy.size, lazy.nbytes, len(lazy)) == (
        full.shape,
        full.dtype,
        full.ndim,
        full.size,
        full.nbytes,
        len(full),
    )
    assert np.shape(lazy) == full.shape and np.ndim(lazy) == 4
    assert "deferred placeholder from node 'p'" in repr(lazy)
    assert np.array_equal(pickle.loads(pickle.dumps(lazy)), full)
    assert np.array_equal(materialize(lazy), full) and not is_placeholder(materialize(lazy))
    # a computed derived array keeps every ndarray behaviour
    assert float((full + 0).mean()) == float(full.mean()) and full[0].shape == full.shape[1:]


def test_a_range_contract_is_not_checked_on_values_that_are_not_here() -> None:
    """A model input declared with a range: the placeholder is checked for dtype and shape only (the
    old placeholder's zeros were checked against the range: out of [0.5, 1] it failed as a 422)."""
    from usg.runtime.contract import check_model_inputs
    from usg.specs import TensorSpec

    spec = TensorSpec(dtype="float32", shape=(1, 3, "h", "w"), range=(0.5, 1.0))
    with deferring():
        lazy = det_preprocess(page(100, 100))["x"]
    check_model_inputs("det", "det", {"x": spec}, {"x": lazy})
    with pytest.raises(ContractError, match="dtype float64"):
        check_model_inputs("det", "det", {"x": spec}, {"x": np.zeros((1, 3, 2, 2))})


def test_a_local_model_given_a_placeholder_fails_before_it_reads_the_memory() -> None:
    """A backend reads the memory directly (np.asarray, a C extension), past the placeholder's hooks:
    while the executor defers anything, a local model's inputs are checked for placeholders."""

    def leaky(image: np.ndarray, **options: Any) -> dict[str, Any]:
        with deferring():  # a node that makes placeholders where nobody defers them
            return det_preprocess(image, **options)

    def sums(inputs: Any) -> dict[str, Any]:
        return {"total": np.array([float(np.asarray(inputs["x"]).sum())])}

    g = (
        GraphBuilder("leak")
        .input("image", "image")
        .model("det", "python", options={"callable": "testops:identity"})
        .model("local", "python", options={"callable": "testops:identity"})
        .node("det_pre", fn="usg.ops.ocr:det_preprocess", inputs={"image": "inputs.image"})
        .node("det", model="det", inputs={"x": "det_pre.x"})
        .node("leak", fn="usg.ops.ocr:det_preprocess", inputs={"image": "inputs.image"})
        .node("local", model="local", inputs={"x": "leak.x"})
        .output("seen", "det.seen")
        .output("total", "local.total")
        .build()
    )
    backends = {"det": Remote(seen), "local": FakeBackend(sums)}
    match = r"node 'local' \(model 'local', read in this process\) input 'x'"
    with (
        Executor(g, backends=backends, fns={"leak": leaky}, cache=False) as ex,
        pytest.raises(DeferredValueRead, match=match),
    ):
        ex.infer_sync({"image": page(300, 500)})
