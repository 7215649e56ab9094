"""usg export triton writes only inside OUT_DIR: names that are paths, and external data outside the model's folder,
are refused before anything is written (a graph named '../../evil' wrote /tmp/evil)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from usg.errors import UsageError
from usg.export.triton import export_triton
from usg.graph import GraphBuilder
from usg.specs import TensorSpec


def _onnx(path: Path, *, external: str | None = None) -> Path:
    w = numpy_helper.from_array(np.ones((3,), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 3])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external is not None:
        w.ClearField("raw_data")
        model.graph.initializer[0].data_location = onnx.TensorProto.EXTERNAL
        del model.graph.initializer[0].float_data[:]
        entry = model.graph.initializer[0].external_data.add()
        entry.key, entry.value = "location", external
    path.write_bytes(model.SerializeToString())  # onnx.save would refuse the '..' (what a hostile file holds)
    return path


def _graph(model: Path, *, name: str = "g", model_name: str = "m", node: str = "n"):
    b = GraphBuilder(name).input("x", "tensor", spec=TensorSpec("float32", ("batch", 3)))
    b.model(model_name, path=model)
    b.node(node, model=model_name, inputs={"x": "inputs.x"})
    b.output("y", f"{node}.y")
    return b.build()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "../../evil"}, r"graph name '\.\./\.\./evil' cannot name a Triton model.*it holds '/'.*'evil'"),
        ({"model_name": "../up"}, r"model '\.\./up' cannot name a Triton model"),
        ({"name": ".hidden"}, r"graph name '\.hidden' cannot name a Triton model.*a leading '\.'"),
        ({"model_name": "a\\b"}, r"model 'a\\\\b' cannot name a Triton model"),
    ],
)
def test_a_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path: Path, kwargs, message) -> None:
    work = tmp_path / "work"
    work.mkdir()
    model = _onnx(work / "m.onnx")
    with pytest.raises(UsageError, match=message):
        export_triton(_graph(model, **kwargs), work / "repo")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["m.onnx", "work"]


def test_external_data_outside_the_models_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "outside.data").write_bytes(np.ones(3, np.float32).tobytes())
    model = _onnx(tmp_path / "models" / "m.onnx", external="../outside.data")
    with pytest.raises(UsageError, match=r"names external data at '\.\./outside\.data', outside its own folder"):
        export_triton(_graph(model), tmp_path / "out" / "repo")
    assert not (tmp_path / "out" / "outside.data").exists()


def test_external_data_beside_the_model_is_copied(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w.data").write_bytes(np.ones(3, np.float32).tobytes())
    model = _onnx(tmp_path / "models" / "m.onnx", external="w.data")
    export_triton(_graph(model), tmp_path / "repo")
    assert (tmp_path / "repo" / "m" / "1" / "w.data").read_bytes() == np.ones(3, np.float32).tobytes()


@pytest.mark.parametrize("location", ["../outside.data", "..\\outside.data", "C:outside.data", "\\outside.data"])
def test_external_data_outside_is_refused_before_out_dir_is_touched(tmp_path: Path, location: str) -> None:
    """The refusal came after OUT_DIR held the model's folder and config.pbtxt (a rerun then met 'OUT_DIR is
    not empty'); a location that leaves the folder when read as a Windows path (a file saved there) passed."""
    (tmp_path / "models").mkdir()
    model = _onnx(tmp_path / "models" / "m.onnx", external=location)
    with pytest.raises(UsageError, match=r"names external data at .*outside its own folder"):
        export_triton(_graph(model), tmp_path / "out" / "repo")
    assert not (tmp_path / "out").exists()


def test_missing_external_data_is_refused_before_out_dir_is_touched(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    model = _onnx(tmp_path / "models" / "m.onnx", external="w.data")
    with pytest.raises(UsageError, match=r"model file .*w\.data does not exist"):
        export_triton(_graph(model), tmp_path / "out" / "repo")
    assert not (tmp_path / "out").exists()


def test_a_windows_subfolder_location_is_still_copied(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w\\1.data").write_bytes(np.ones(3, np.float32).tobytes())  # one file name here
    model = _onnx(tmp_path / "models" / "m.onnx", external="w\\1.data")
    export_triton(_graph(model), tmp_path / "repo")
    assert (tmp_path / "repo" / "m" / "1" / "w\\1.data").is_file()


def test_external_data_linked_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    """'w.data -> /elsewhere/secret' was followed: the export copied that file into the repository."""
    (tmp_path / "models").mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(np.ones(3, np.float32).tobytes())
    (tmp_path / "models" / "w.data").symlink_to(secret)
    model = _onnx(tmp_path / "models" / "m.onnx", external="w.data")
    with pytest.raises(UsageError, match=r"its external data 'w\.data' is a symbolic link to .*secret, outside"):
        export_triton(_graph(model), tmp_path / "repo")
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_a_hugging_face_snapshot_whose_files_link_into_blobs_still_exports(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123" / "onnx"
    snapshot.mkdir(parents=True)
    (repo / "blobs" / "f00d").write_bytes(np.ones(3, np.float32).tobytes())
    (snapshot / "w.data").symlink_to(Path("../../../blobs/f00d"))
    model = _onnx(snapshot / "m.onnx", external="w.data")
    export_triton(_graph(model), tmp_path / "out")
    assert (tmp_path / "out" / "m" / "1" / "w.data").read_bytes() == np.ones(3, np.float32).tobytes()
