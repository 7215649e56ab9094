"""`usg doctor` command line and the runner underneath: detection, exit codes, formats, dispatch."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper

from usg.cli import cli
from usg.doctor import Finding, Location, RootCause, Severity, parse_targets, run_doctor
from usg.doctor import runner as runner_mod
from usg.doctor.detect import Target, detect_targets
from usg.doctor.registry import CheckInfo
from usg.errors import UsageError


def write_relu(path: Path, shape: list[Any]) -> Path:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, shape)],
        [helper.make_tensor_value_info("y", T.FLOAT, shape)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["doctor", *args])


def test_detects_each_target_kind(tmp_path: Path) -> None:
    onnx_file = write_relu(tmp_path / "a.onnx", ["N", 3])
    graph = tmp_path / "g.yaml"
    graph.write_text("name: g\nmodels: {}\nnodes: {}\n")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    model_dir = tmp_path / "repo" / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text('name: "m"\n')
    write_relu(model_dir / "1" / "model.onnx", ["N", 3])
    assert detect_targets(onnx_file) == [Target("onnx", onnx_file)]
    assert detect_targets(graph) == [Target("graph", graph)]
    assert detect_targets(hf) == [Target("hf_model", hf)]
    assert detect_targets(model_dir / "config.pbtxt") == [Target("triton_model", model_dir)]
    assert detect_targets(tmp_path / "repo") == [
        Target("triton_model", model_dir),
        Target("onnx", model_dir / "1" / "model.onnx"),
    ]
    other = tmp_path / "notes.txt"
    other.write_text("hi")
    with pytest.raises(UsageError, match="cannot tell what"):
        detect_targets(other)


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_path_that_is_neither_file_nor_directory_is_a_usage_error(tmp_path: Path, kind: str) -> None:
    # before: NotADirectoryError out of iterdir(), shown as "internal error"
    path = Path("/dev/null")
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    with pytest.raises(UsageError, match=r"is neither a regular file nor a directory \(a device, pipe or socket\)"):
        detect_targets(path)


def test_sniffing_a_huge_yaml_reads_its_head_only(tmp_path: Path) -> None:
    big = tmp_path / "data.yaml"
    with big.open("wb") as fh:
        fh.write(b"nodes: {}\n")
        fh.truncate(64 * 1024 * 1024)  # sparse
    tracemalloc.start()
    try:
        targets = detect_targets(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert targets == [Target("graph", big)]
    assert peak < 4 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB to sniff a 64 MiB file"  # before: 128 MiB


def test_parse_targets() -> None:
    assert parse_targets("ort=1.20,tensorrt=10.3") == {"ort": (1, 20), "tensorrt": (10, 3)}
    assert parse_targets("onnxruntime=1.17, trt=8.6") == {"ort": (1, 17), "tensorrt": (8, 6)}
    with pytest.raises(UsageError, match="RUNTIME=VERSION"):
        parse_targets("ort")
    with pytest.raises(UsageError, match="RUNTIME=VERSION"):
        parse_targets("openvino=2024.1")
    with pytest.raises(UsageError, match="names ort twice"):
        parse_targets("ort=1.17,onnxruntime=1.20")


def test_repeated_target_flags_all_count(tmp_path: Path) -> None:
    # before: click kept only the last --target, so ort=1.17 was silently not checked
    p = tmp_path / "m.onnx"
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3])],
            [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])],
        ),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    m.ir_version = 10
    onnx.save(m, str(p))
    result = invoke(str(p), "--target", "ort=1.17", "--target", "tensorrt=8.6", "--format", "json")
    assert result.exit_code == 1, result.output
    runtimes = sorted(f["evidence"]["runtime"] for f in json.loads(result.output)["findings"] if f["code"] == "ONNX004")
    assert runtimes == ["onnxruntime", "tensorrt"]


def test_missing_check_modules_are_skipped_but_broken_ones_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert runner_mod.load_check_modules(["usg.doctor.onnx.checks", "usg.doctor.not_written_yet"]) == [
        "usg.doctor.onnx.checks"
    ]
    # a check module that exists but imports something missing is a real bug: it must surface
    (tmp_path / "doctor_broken_checks_for_test.py").write_text("import a_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_there"):
        runner_mod.load_check_modules(["doctor_broken_checks_for_test"])


def test_hf_checks_get_the_directory_and_crashes_become_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = tmp_path / "llava"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    seen: list[Path] = []

    def ok(path: Path) -> list[Finding]:
        seen.append(path)
        return [
            Finding(
                "HF001",
                Severity.ERROR,
                RootCause.VERSION_COUPLING,
                "576 vs 729",
                Location(str(path / "config.json")),
                "fix it",
            )
        ]

    def boom(path: Path, ctx: object) -> list[Finding]:
        raise KeyError("vision_config")

    fake = [CheckInfo("ok", "hf_model", (), ok), CheckInfo("boom", "hf_model", (), boom)]
    monkeypatch.setattr(runner_mod, "checks_for", lambda kind: fake if kind == "hf_model" else [])
    report = run_doctor([hf])
    assert seen == [hf]
    assert sorted(f.code for f in report.findings) == ["DOCTOR001", "HF001"]
    crash = next(f for f in report.findings if f.code == "DOCTOR001")
    assert crash.evidence["check"] == "boom" and "vision_config" in crash.evidence["exception"]
    assert report.exit_code == 1


def test_exit_codes(tmp_path: Path) -> None:
    good = write_relu(tmp_path / "good.onnx", ["N", 3])
    assert invoke(str(good)).exit_code == 0
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    result = invoke(str(good), str(bad))
    assert result.exit_code == 1 and "ONNX018" in result.output
    missing = invoke(str(tmp_path / "nope.onnx"))
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert "Traceback" not in missing.output
    assert invoke(str(good), "--format", "yaml").exit_code == 2
    bad_target = invoke(str(good), "--target", "ort")
    assert bad_target.exit_code == 2 and "RUNTIME=VERSION" in bad_target.output
    assert invoke().exit_code == 2


def test_formats_and_output_file(tmp_path: Path) -> None:
    model = write_relu(tmp_path / "fixed.onnx", [1, 3])
    out = tmp_path / "report.json"
    result = invoke(str(model), "--format", "json", "--output", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [f["code"] for f in doc["findings"]] == ["ONNX008"]
    assert doc["findings"][0]["evidence"]["shape"] == [1, 3]
    sarif = json.loads(invoke(str(model), "--format", "sarif").output)
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"][0]["ruleId"] == "ONNX008"
    assert "<!DOCTYPE html>" in invoke(str(model), "--format", "html").output


def test_list_checks_documents_every_code() -> None:
    result = invoke("--list-checks")
    assert result.exit_code == 0
    from usg.doctor.registry import all_codes

    documented = set(line.split()[0] for line in result.output.splitlines() if line and not line[0].isspace())
    assert {c.code for c in all_codes()} <= documented
    assert {"ONNX001", "ONNX011", "TRITON001", "TRITON024", "TRITON037"} <= documented


def test_subcommand_dispatch_runs_the_real_logs_command(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "E1203 10:00:00.000 1 model_lifecycle.cc:626] failed to load 'resnet' version 1: Invalid argument: "
        "model 'resnet', tensor 'input': the model expects 4 dimensions (shape [-1,3,224,224]) but the model "
        "configuration specifies 3 dimensions (shape [3,224,224])\n"
    )
    result = invoke("logs", str(log), "--format", "json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert [f["code"] for f in doc["findings"]] == ["LOG005"]
    finding = doc["findings"][0]
    assert finding["location"]["file"] == str(log)
    assert (finding["evidence"]["model_rank"], finding["evidence"]["config_rank"]) == (4, 3)


def test_missing_subcommand_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.cli import doctor_cmd

    monkeypatch.setitem(doctor_cmd.SUBCOMMANDS, "parity", "usg.cli.doctor_parity_cmd_absent:parity")
    result = invoke("parity", "--torch", "x")
    assert result.exit_code == 2 and "not available" in result.output


def test_unwritable_output_is_a_usage_problem(tmp_path: Path) -> None:
    model = write_relu(tmp_path / "ok.onnx", ["N", 3])
    result = invoke(str(model), "--output", str(tmp_path / "no" / "such" / "dir" / "r.txt"))
    assert result.exit_code == 2 and "cannot write" in result.output
