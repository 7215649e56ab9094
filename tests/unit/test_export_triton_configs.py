"""usg export triton on hand-built graphs and tiny ONNX files: configs parsed back with Triton's schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from onnx import TensorProto as T
from onnx import helper

from usg.doctor import run_doctor
from usg.errors import GraphError, UsageError
from usg.export.triton import BLS, ENSEMBLE, export_triton, plan_export
from usg.graph import BatchPolicy, GraphBuilder, load_graph
from usg.specs import TensorSpec

pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def onnx_model(path: Path, inputs: list[tuple[str, int, list[Any]]], outputs: list[tuple[str, int, list[Any]]]) -> Path:
    """Identity from each input to the output at the same position."""
    nodes = [helper.make_node("Identity", [i[0]], [o[0]]) for i, o in zip(inputs, outputs, strict=True)]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def read_config(repo: Path, name: str) -> Any:
    from google.protobuf import text_format

    config = pb2.ModelConfig()
    text_format.Parse((repo / name / "config.pbtxt").read_text(), config)
    return config


def tensors(entries: Any) -> dict[str, tuple[str, list[int], list[int] | None]]:
    return {
        t.name: (pb2.DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None)
        for t in entries
    }


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "onnx"
    d.mkdir()
    return {
        "img": onnx_model(d / "img.onnx", [("x", T.FLOAT, ["n", 3, "h", "w"])], [("y", T.FLOAT, ["n", 3, "h", "w"])]),
        "ids": onnx_model(
            d / "ids.onnx",
            [("ids", T.INT64, ["batch", "seq"]), ("mask", T.UINT8, ["batch", 4])],
            [("out", T.INT64, ["batch", "seq"]), ("score", T.UINT8, ["batch", 4])],
        ),
        "fixed": onnx_model(d / "fixed.onnx", [("x", T.FLOAT, [1, 4])], [("y", T.FLOAT, [1, 4])]),
        "vec": onnx_model(d / "vec.onnx", [("x", T.FLOAT, ["n", 4])], [("y", T.FLOAT, ["n", 4])]),
        "flat": onnx_model(d / "flat.onnx", [("x", T.DOUBLE, ["n"])], [("y", T.DOUBLE, ["n"])]),
    }


X4 = TensorSpec("float32", (1, 4))


def test_dtypes_dims_batching_and_instances(tmp_path: Path, models: dict[str, Path]) -> None:
    graph = (
        GraphBuilder("g")
        .input("img", "tensor", spec=TensorSpec("float32", (1, 3, None, None)))
        .input("ids", "tensor", spec=TensorSpec("int64", (1, None)))
        .input("mask", "tensor", spec=TensorSpec("uint8", (1, 4)))
        .input("x", "tensor", spec=X4)
        .input("d", "tensor", spec=TensorSpec("float64", (1,)))
        .model("img", path=models["img"], batch=BatchPolicy(max_size=8, max_delay_ms=2.5, preferred_sizes=(4, 8)))
        .model("ids", path=models["ids"], options={"concurrency": 3, "intra_op_threads": 2})
        .model("fixed", path=models["fixed"])
        .model("flat", path=models["flat"])
        .node("img", model="img", inputs={"x": "inputs.img"})
        .node("ids", model="ids", inputs={"ids": "inputs.ids", "mask": "inputs.mask"})
        .node("fixed", model="fixed", inputs={"x": "inputs.x"})
        .node("flat", model="flat", inputs={"x": "inputs.d"})
        .output("a", "img.y")
        .output("b", "ids.out")
        .output("c", "fixed.y")
        .output("e", "flat.y")
        .deploy({"models": {"img": {"num_replicas": 2, "num_gpus": 1}}})
        .build()
    )
    export_triton(graph, tmp_path / "repo")
    img = read_config(tmp_path / "repo", "img")
    assert (img.platform, img.max_batch_size) == ("onnxruntime_onnx", 8)
    assert tensors(img.input) == {"x": ("TYPE_FP32", [3, -1, -1], None)}
    assert img.dynamic_batching.max_queue_delay_microseconds == 2500
    assert list(img.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [(g.count, pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in img.instance_group] == [(2, "KIND_GPU")]
    ids = read_config(tmp_path / "repo", "ids")
    assert ids.max_batch_size == 1 and not ids.HasField("dynamic_batching")  # no policy, dynamic batch dim
    assert tensors(ids.input) == {"ids": ("TYPE_INT64", [-1], None), "mask": ("TYPE_UINT8", [4], None)}
    assert [(g.count, pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in ids.instance_group] == [(3, "KIND_CPU")]
    assert ids.parameters["intra_op_thread_count"].string_value == "2"
    fixed = read_config(tmp_path / "repo", "fixed")
    assert fixed.max_batch_size == 0 and tensors(fixed.output) == {"y": ("TYPE_FP32", [1, 4], None)}
    flat = read_config(tmp_path / "repo", "flat")  # [batch] only: per item a scalar, declared [1] -> []
    assert flat.max_batch_size == 1 and tensors(flat.input) == {"x": ("TYPE_FP64", [1], [])}
    assert (tmp_path / "repo" / "img" / "1" / "model.onnx").read_bytes() == models["img"].read_bytes()
    assert run_doctor([tmp_path / "repo"]).errors == 0


def test_a_batch_policy_on_a_fixed_batch_dim_is_refused_before_writing(tmp_path: Path, models: dict[str, Path]) -> None:
    graph = (
        GraphBuilder("g")
        .input("x", "tensor", spec=X4)
        .model("fixed", path=models["fixed"], batch=BatchPolicy(max_size=4))
        .node("f", model="fixed", inputs={"x": "inputs.x"})
        .output("y", "f.y")
        .build()
    )
    with pytest.raises(GraphError, match=r"(?s)models\.fixed\.batch\.max_size.*no dynamic first.*fix: remove batch"):
        export_triton(graph, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def chain(models: dict[str, Path], *, optional: bool = False) -> GraphBuilder:
    return (
        GraphBuilder("chain")
        .input("x", "tensor", spec=X4, optional=optional)
        .model("a", path=models["vec"], batch=BatchPolicy(max_size=4, max_delay_ms=1))
        .model("b", path=models["vec"])
        .node("a", model="a", inputs={"x": "inputs.x"})
        .node("neg", fn="testops:negate", inputs={"x": "a.out"})
        .node("b", model="b", inputs={"x": "neg.y"})
        .output("y", "b.y")
        .output("mid", "a.y")
    )


def test_a_graph_without_branches_is_an_ensemble_wired_step_by_step(tmp_path: Path, models: dict[str, Path]) -> None:
    graph = chain(models).build()
    result = export_triton(graph, tmp_path / "repo", link=True)
    assert (result.mode, result.reasons) == (ENSEMBLE, ())
    assert [(m.name, m.kind) for m in result.models] == [
        ("a", "onnx"),
        ("b", "onnx"),
        ("chain", "ensemble"),
        ("neg", "fn"),
    ]
    assert (tmp_path / "repo" / "a" / "1" / "model.onnx").resolve() == models["vec"].resolve()
    ens = read_config(tmp_path / "repo", "chain")
    assert ens.platform == "ensemble" and ens.max_batch_size == 0 and not ens.instance_group
    assert tensors(ens.input) == {"x": ("TYPE_FP32", [1, 4], None)}
    assert tensors(ens.output) == {"y": ("TYPE_FP32", [-1, 4], None), "mid": ("TYPE_FP32", [-1, 4], None)}
    steps = [(s.model_name, dict(s.input_map), dict(s.output_map)) for s in ens.ensemble_scheduling.step]
    assert steps == [
        ("a", {"x": "x"}, {"y": "mid"}),  # a.out is a.y, also the graph output 'mid'
        ("neg", {"x": "mid"}, {"y": "neg.y"}),
        ("b", {"x": "neg.y"}, {"y": "y"}),
    ]
    neg = read_config(tmp_path / "repo", "neg")
    assert (neg.backend, neg.max_batch_size) == ("python", 0)
    assert tensors(neg.input) == {"x": ("TYPE_FP32", [-1, 4], None)}
    assert tensors(neg.output) == {"y": ("TYPE_FP32", [1, -1], None)}
    assert neg.parameters["usg_fn"].string_value == "testops:negate"
    model_py = (tmp_path / "repo" / "neg" / "1" / "model.py").read_text()
    assert "from usg.export.triton.python_models import FnNodeModel as TritonPythonModel" in model_py
    assert (tmp_path / "repo" / "neg" / "1" / "testops.py").is_file()  # not installed: copied next to model.py
    assert (tmp_path / "repo" / "chain" / "1").is_dir() and not any((tmp_path / "repo" / "chain" / "1").iterdir())
    assert run_doctor([tmp_path / "repo"]).errors == 0


def test_why_not_an_ensemble(models: dict[str, Path]) -> None:
    plan = plan_export(chain(models, optional=True).build())
    assert plan.mode == BLS
    assert plan.reasons == ("input 'x' is optional (a modality branch Triton ensembles cannot prune)",)
    same_name = plan_export(chain(models).output("x", "neg.y").build())
    assert same_name.reasons == ("output 'x' has the name of an input (one ensemble tensor name)",)
    fanout = (
        GraphBuilder("fan")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .input("t", "text")
        .model("m", "python", options={"callable": "testops:identity"})
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .node("up", fn="testops:upper", inputs={"text": "inputs.t"})
        .output("y", "dbl.y")
        .output("u", "up.text")
        .build()
    )
    assert plan_export(fanout).reasons == (
        "model 'm' (backend python) declares no tensor dtypes/shapes",
        "node 'dbl' maps over a list (fan-out)",
        "split.items is not a tensor with a dtype and shape (a Python value)",
        "dbl.y is not a tensor with a dtype and shape (a Python value)",
        "up.text is not a tensor with a dtype and shape (a Python value)",
    )


def test_bls_model_runs_a_copy_of_the_graph_that_points_at_the_repository(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    graph = (
        GraphBuilder("g")
        .input("text", "text", optional=True)
        .input("x", "tensor", spec=X4, optional=True)
        .model("a", path=models["vec"], batch=BatchPolicy(max_size=4))
        .node("n", fn="testops:text_length", inputs={"text": "inputs.text"}, options={"scale": 2.0})
        .node("a", model="a", inputs={"x": "inputs.x"})
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .output("n", "n.n")
        .output("y", "a.out")
        .output("shout", "up.text")
        .build()
    )
    result = export_triton(graph, tmp_path / "repo")
    assert result.mode == BLS
    bls = read_config(tmp_path / "repo", "g")
    assert (bls.backend, bls.max_batch_size) == ("python", 0)
    assert {t.name: t.optional for t in bls.input} == {"text": True, "x": True}
    assert tensors(bls.input) == {"text": ("TYPE_STRING", [1], None), "x": ("TYPE_FP32", [1, 4], None)}
    assert tensors(bls.output) == {
        "n": ("TYPE_FP32", [1, 1], None),
        "y": ("TYPE_FP32", [-1, 4], None),
        "shout": ("TYPE_STRING", [-1], None),  # no contract: JSON / UTF-8 documents
    }
    version = tmp_path / "repo" / "g" / "1"
    doc = yaml.safe_load((version / "graph.yaml").read_text())
    assert doc["models"]["a"] == {"backend": "onnxruntime", "path": "../../a/1/model.onnx"}  # no batch: Triton batches
    assert doc["nodes"]["n"]["options"] == {"scale": 2.0}
    copy = load_graph(version / "graph.yaml")
    assert copy.models["a"].path == (tmp_path / "repo" / "a" / "1" / "model.onnx").resolve()
    assert set(copy.nodes) == set(graph.nodes) and copy.outputs == graph.outputs
    assert (version / "testops.py").is_file()
    assert "from usg.export.triton.bls import GraphModel as TritonPythonModel" in (version / "model.py").read_text()
    assert run_doctor([tmp_path / "repo"]).errors == 0


def test_onnx_via_python_serves_onnx_with_python_backend_models(tmp_path: Path, models: dict[str, Path]) -> None:
    export_triton(chain(models).build(), tmp_path / "repo", onnx_via="python")
    a = read_config(tmp_path / "repo", "a")
    assert (a.platform, a.backend, a.max_batch_size) == ("", "python", 4)
    assert a.parameters["usg_backend"].string_value == "onnxruntime"
    assert a.parameters["usg_file"].string_value == "model.onnx"
    assert {p.name for p in (tmp_path / "repo" / "a" / "1").iterdir()} == {"model.onnx", "model.py"}
    assert run_doctor([tmp_path / "repo"]).errors == 0


def test_out_dir_must_be_empty_unless_forced(tmp_path: Path, models: dict[str, Path]) -> None:
    graph = chain(models).build()
    out = tmp_path / "repo"
    (out / "stale").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"OUT_DIR .* is not empty; fix: pass --force"):
        export_triton(graph, out)
    export_triton(graph, out, force=True)
    assert not (out / "stale").exists() and (out / "chain" / "config.pbtxt").is_file()
    with pytest.raises(UsageError, match=r"onnx_via is 'tensorrt'; fix: use one of onnxruntime, python"):
        export_triton(graph, out, onnx_via="tensorrt")


def test_graph_and_model_with_one_name_is_refused(models: dict[str, Path]) -> None:
    graph = (
        GraphBuilder("a")
        .input("x", "tensor", spec=X4)
        .model("a", path=models["vec"])
        .node("n", model="a", inputs={"x": "inputs.x"})
        .output("y", "n.y")
        .build()
    )
    with pytest.raises(UsageError, match=r"graph is named 'a', like one of its models.*fix: rename the graph"):
        plan_export(graph)


def test_cli_lists_the_models_runs_the_doctor_and_refuses_a_full_out_dir(
    tmp_path: Path, models: dict[str, Path], capsys: Any
) -> None:
    from usg.cli import main

    graph = tmp_path / "g.yaml"
    graph.write_text(
        f"name: chain\ninputs: {{x: {{dtype: float32, shape: [1, 4]}}}}\n"
        f"models: {{m: {{path: '{models['vec']}', batch: {{max_size: 4}}, options: {{concurrency: 2}}}}}}\n"
        "nodes: {m: {model: m, inputs: {x: inputs.x}}}\noutputs: {y: m.y}\n"
    )
    out = tmp_path / "repo"
    assert main(["export", "triton", str(graph), str(out)]) is None
    printed = capsys.readouterr().out
    assert "platform/backend" in printed and "onnxruntime_onnx" in printed
    assert "graph 'chain': a Triton ensemble" in printed
    assert f"usg doctor {out}: 0 error(s), 0 warning(s)" in printed
    with pytest.raises(SystemExit) as exc:
        main(["export", "triton", str(graph), str(out)])
    assert exc.value.code == 2
    assert "is not empty; fix: pass --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["export", "triton", str(graph), str(out), "--onnx-via", "tensorrt"])
    assert exc.value.code == 2
