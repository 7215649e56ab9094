"""quantize_graph end to end on a tiny real ONNX graph (text → length → two MatMuls), the sidecar
round trip through load_graph_for_cli, the fallback on a harmful weight, and the CLI's errors."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from usg.bench.samples import Sample  # noqa: E402
from usg.cli import main  # noqa: E402
from usg.errors import GraphError  # noqa: E402
from usg.graph import load_graph  # noqa: E402
from usg.graph.sidecar import apply_quant_sidecar, quant_sidecar_path  # noqa: E402
from usg.quantize import QuantizeConfig, QuantSettings, parse_guard, quantize_graph, write_quant_sidecar  # noqa: E402
from usg.quantize.ranking import activation_sqnr, rank_nodes, weight_sqnr  # noqa: E402
from usg.quantize.report import render_text, result_json, write_html  # noqa: E402

GRAPH = """name: tiny
inputs:
  text: {modality: text}
models:
  mlp: {backend: onnxruntime, path: mlp.onnx}
nodes:
  n: {fn: "testops:length", inputs: {text: inputs.text}}
  mlp: {model: mlp, inputs: {x: n.n}}
outputs: {y: mlp.y}
"""


def _mlp(path: Path, *, outlier: float) -> Path:
    rng = np.random.default_rng(0)
    w1 = rng.normal(scale=0.05, size=(1, 16)).astype(np.float32)
    w1[0, 0] = outlier  # one huge weight: per-tensor int8 rounds the other 15 to zero
    w2 = rng.normal(scale=0.3, size=(16, 4)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    _mlp(tmp_path / "mlp.onnx", outlier=-40.0)
    (tmp_path / "graph.yaml").write_text(GRAPH)
    return tmp_path / "graph.yaml"


SAMPLES = [Sample(f"s{i}", text="x" * (5 + 7 * i)) for i in range(8)]
DYNAMIC = QuantSettings("dynamic", per_channel=False, weights="uint8")


def test_fallback_keeps_the_harmful_matmul_in_fp32(tiny: Path, tmp_path: Path):
    graph = load_graph(tiny)
    config = QuantizeConfig(settings=DYNAMIC, guards=(parse_guard("y:max_rel<=0.02"),))
    result = quantize_graph(graph, SAMPLES, config, tmp_path / "q")
    o = result.outcomes["mlp"]
    assert o.sensitivity is not None and not o.sensitivity.holds  # quantized as is, the guard fails
    assert result.holds and o.path is not None and o.path.parent == tmp_path / "q"
    assert o.settings.exclude_nodes == ("mm1",)  # the outlier weight ranks first
    assert result.combined is not None and result.combined.metrics["y"]["max_rel"] <= 0.02
    assert (result.calibration_samples, result.holdout_samples) == (6, 2)
    data = result_json(result)
    assert data["holds"] and data["models"]["mlp"]["settings"]["exclude_nodes"] == ["mm1"]
    assert not list((tmp_path / "q").glob("usg-quant-*"))  # trial files are gone


def test_the_guard_not_holding_leaves_the_model_fp32(tiny: Path, tmp_path: Path):
    graph = load_graph(tiny)
    config = QuantizeConfig(settings=DYNAMIC, guards=(parse_guard("y:max_abs<=0"),), max_trials=3)
    result = quantize_graph(graph, SAMPLES, config, tmp_path / "q")
    assert not result.holds and result.outcomes["mlp"].path is None
    assert result.outcomes["mlp"].status == "fp32"
    assert result.outcomes["mlp"].ranked[0] == "mm1"
    console = Console(record=True, width=200)
    render_text(result, console)
    text = console.export_text()
    assert "the guard does not hold: what would have to stay FP32" in text and "mm1" in text


def test_cli_exits_1_without_a_sidecar_when_the_guard_cannot_hold(tiny: Path, tmp_path: Path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "t.txt").write_text("\n".join(s.text or "" for s in SAMPLES))
    argv = ["quantize", str(tiny), "--inputs", str(inputs), "--method", "dynamic", "--guard", "y:max_abs<=0"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--max-trials", "2", "--no-measure", "--json"])
    assert exc.value.code == 1
    assert "the guard does not hold after 2 quantization(s); no sidecar written" in capsys.readouterr().err.replace(
        "\n", " "
    )
    assert not quant_sidecar_path(tiny).exists()
    main(["quantize", str(tiny), "--inputs", str(inputs), "--method", "dynamic", "--no-measure"])
    assert quant_sidecar_path(tiny).is_file() and (tmp_path / "graph.quant" / "mlp.dynamic.onnx").is_file()


def test_sidecar_round_trip_and_fp32(tiny: Path, tmp_path: Path, capsys):
    graph = load_graph(tiny)
    result = quantize_graph(graph, SAMPLES, QuantizeConfig(settings=QuantSettings("dynamic")), tmp_path / "q")
    assert result.holds  # default guard for a tensor output: max_rel<=0.05
    path = quant_sidecar_path(tiny)
    assert path.name == "graph.quant.yaml"
    doc = write_quant_sidecar(result, path)
    assert doc["models"]["mlp"]["path"] == "q/mlp.dynamic.onnx"
    applied = apply_quant_sidecar(load_graph(tiny))
    assert applied.models["mlp"].path == tmp_path / "q" / "mlp.dynamic.onnx"
    if importlib.util.find_spec("matplotlib") is not None:  # usg[report]
        html = write_html(result, tmp_path / "report.html")
        assert "mlp" in html.read_text() and html.with_suffix(".png").is_file()
    # usg run applies it; --fp32 ignores it
    main(["run", str(tiny), "-i", "text=hello", "--json"])
    assert "using quantized models" in capsys.readouterr().err
    main(["run", str(tiny), "-i", "text=hello", "--json", "--fp32"])
    assert "using quantized models" not in capsys.readouterr().err


def test_stale_or_broken_sidecar_is_a_graph_error(tiny: Path, tmp_path: Path):
    graph = load_graph(tiny)
    result = quantize_graph(graph, SAMPLES, QuantizeConfig(settings=QuantSettings("dynamic")), tmp_path / "q")
    write_quant_sidecar(result, quant_sidecar_path(tiny))
    m = onnx.load(str(tmp_path / "mlp.onnx"))
    m.doc_string = "re-exported"  # the FP32 file changes (its size too)
    onnx.save(m, str(tmp_path / "mlp.onnx"))
    with pytest.raises(GraphError, match=r"(?s)mlp.onnx changed since it was quantized.*fix: run `usg quantize"):
        apply_quant_sidecar(load_graph(tiny))
    quant_sidecar_path(tiny).write_text("usg_tune: 1\n")
    with pytest.raises(GraphError, match=r"not a usg quantize sidecar \(version 1\)"):
        apply_quant_sidecar(load_graph(tiny))


def test_sqnr_proxies():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(250, 4))
    spiky = x.copy()
    spiky[0, 0] = 500.0  # one outlier in channel 0 drowns channels 1-3
    assert activation_sqnr([x]) > activation_sqnr([spiky]) + 20
    assert activation_sqnr([np.zeros(4)]) == float("inf")
    w = rng.normal(size=(8, 4))
    assert weight_sqnr(w, axis=None) > 35
    w[0, 0] = 100.0
    assert weight_sqnr(w, axis=-1) > weight_sqnr(w, axis=None)  # per channel isolates the outlier


def test_rank_nodes_orders_by_local_noise(tmp_path: Path):
    model = _mlp(tmp_path / "m.onnx", outlier=-40.0)
    items = [{"x": np.array([[float(n)]], np.float32)} for n in (3, 9, 20)]
    ranked = rank_nodes(model, DYNAMIC, items)
    assert [h.node for h in ranked] == ["mm1", "mm2"] and ranked[0].where == "weight w1"
    assert rank_nodes(model, QuantSettings("dynamic", exclude_nodes=("mm1",)), items)[0].node == "mm2"


@pytest.mark.parametrize(
    ("args", "code", "match"),
    [
        (["--guard", "y>=1"], 2, "not OUTPUT:METRIC>=X"),
        (["--models", "det"], 2, "--models det: not an ONNX model of graph 'tiny'; fix: use some of mlp"),
        (["--guard", "z:cosine>=0.9"], 2, "no comparable output 'z'"),
    ],
)
def test_cli_errors(tiny: Path, tmp_path: Path, capsys, args, code, match):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "t.txt").write_text("\n".join(s.text or "" for s in SAMPLES))
    with pytest.raises(SystemExit) as exc:
        main(["quantize", str(tiny), "--inputs", str(inputs), "--no-measure", *args])
    assert exc.value.code == code
    assert match in capsys.readouterr().err.replace("\n", " ")


def test_int4_is_matmulnbits_weight_only(tmp_path: Path):
    pytest.importorskip("onnx_ir", reason="ONNX Runtime's MatMulNBits quantizer needs onnx_ir (comes with onnxscript)")
    from usg.quantize import quantize_model

    rng = np.random.default_rng(1)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    out = quantize_model(tmp_path / "m.onnx", tmp_path / "m.int4.onnx", QuantSettings("int4"))
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["MatMulNBits"]
    import onnxruntime as ort

    x = rng.normal(size=(2, 64)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref = x @ w
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) < 0.2  # 4-bit weights: close, not equal
    assert QuantSettings("int4").to_json() == {"method": "int4"}


@pytest.mark.parametrize("level", [logging.NOTSET, logging.INFO, logging.CRITICAL])
def test_quantizing_leaves_the_process_logging_as_it_was(tmp_path: Path, level: int) -> None:
    """ORT's hint is silenced during the call only: raised for good, the root level hid every later warning of the
    process (a cache's decode warnings in the same process were lost)."""
    from usg.quantize import quantize_model

    src = _mlp(tmp_path / "mlp.onnx", outlier=1.0)
    root = logging.getLogger()
    before = root.level
    root.setLevel(level)
    try:
        quantize_model(src, tmp_path / "mlp.q.onnx", DYNAMIC)
        assert root.level == level
    finally:
        root.setLevel(before)


def test_output_paths_it_cannot_write_fail_before_the_work(tiny: Path, tmp_path: Path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "t.txt").write_text("\n".join(s.text or "" for s in SAMPLES))
    (tmp_path / "file").write_text("")
    argv = ["quantize", str(tiny), "--inputs", str(inputs), "--method", "dynamic", "--no-measure"]
    cases = [
        # before: FileNotFoundError / NotADirectoryError as "internal error", after calibration
        (["--out", str(tmp_path / "file" / "q")], 2, "--out '.*file/q': cannot write quantized models there"),
        # before: the whole quantization, then "internal error: FileNotFoundError"
        (["--html", str(tmp_path / "nodir" / "r.html")], 2, "--html '.*nodir/r.html': folder '.*nodir' does not exist"),
        (["--html", str(tmp_path / "file" / "r.html")], 2, "folder '.*file' does not exist"),
    ]
    for extra, code, message in cases:
        with pytest.raises(SystemExit) as exc:
            main([*argv, *extra])
        err = capsys.readouterr().err.replace("\n", " ")
        assert exc.value.code == code and re.search(message, err) and "calibrating" not in err, (extra, err)
    assert not quant_sidecar_path(tiny).exists()


def test_a_run_whose_guard_does_not_hold_leaves_an_earlier_runs_files_alone(tiny: Path, tmp_path: Path, monkeypatch):
    """Models kept after _fix_alone while the combined guard fails (--max-trials ran out): before, their
    files replaced q/NAME.METHOD.onnx, which the sidecar of an earlier run that held points at."""
    import usg.quantize.runner as runner

    out = tmp_path / "q"
    out.mkdir()
    earlier = out / "mlp.dynamic.onnx"
    earlier.write_bytes(b"the model an earlier run kept")
    fix_alone = runner._fix_alone

    def kept_alone(search, o, first):  # as if the model had held alone
        fix_alone(search, o, first)
        o.path = o.path or first

    monkeypatch.setattr(runner, "_fix_alone", kept_alone)
    config = QuantizeConfig(settings=DYNAMIC, guards=(parse_guard("y:max_abs<=0"),), max_trials=1)
    result = quantize_graph(load_graph(tiny), SAMPLES, config, out)
    assert not result.holds
    assert earlier.read_bytes() == b"the model an earlier run kept"
    assert result.outcomes["mlp"].path == out / "mlp.dynamic.unguarded.onnx"
    assert sorted(p.name for p in out.iterdir()) == ["mlp.dynamic.onnx", "mlp.dynamic.unguarded.onnx"]
