"""Arrays a process only sends are not computed there (usg.runtime.deferral, usg.ops.wire).

The Ray engine's router sends det's float32 input to det's replica as the uint8 page it is
computed from; the router itself never reads it. These tests run the real det pre-processing
with a stand-in for det (a fake backend marked remote and shipping derived values, as the router's
RayModelBackend is)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

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
