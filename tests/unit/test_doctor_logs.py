"""usg doctor logs: realistic log excerpts (timestamps, frames, INFO noise) classified into root causes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from usg.cli.doctor_logs_cmd import logs
from usg.doctor.findings import RootCause, Severity, Stage
from usg.doctor.logs.classify import classify_line, classify_text
from usg.doctor.logs.rules import RULES
from usg.doctor.registry import all_codes
from usg.errors import UsageError

LOGS = Path(__file__).parents[1] / "resources" / "logs"


def _read(name: str) -> list:
    """The signature rules alone (the learned layer has its own tests in test_doctor_logs_learned.py)."""
    return classify_text((LOGS / name).read_text(), name, learned=False)


def _by_code(findings: list, code: str):
    hits = [f for f in findings if f.code == code]
    assert hits, f"{code} not in {[f.code for f in findings]}"
    return hits[0]


def test_triton_server_log() -> None:
    found = _read("triton_server.log")
    assert [f.code for f in found] == ["LOG005", "LOG001", "LOG003", "LOG000"]
    byte = _by_code(found, "LOG001")
    assert byte.root_cause is RootCause.DTYPE_OR_RANGE
    assert byte.evidence["ratio"] == 4 and byte.evidence["expected_bytes"] == 602112
    assert "uint8" in byte.message and "float32" in byte.message
    assert byte.evidence["count"] == 2  # the repeated request error is merged
    prof = _by_code(found, "LOG003")
    assert prof.root_cause is RootCause.BATCH_DIM_CONFIG
    assert (prof.evidence["min"], prof.evidence["max"], prof.evidence["received"]) == (1, 1, 32)
    assert "built for batch 1" in prof.message
    cfg = _by_code(found, "LOG005")
    assert cfg.root_cause is RootCause.BATCH_DIM_CONFIG and "max_batch_size: 0" in cfg.fix
    unknown = _by_code(found, "LOG000")
    assert unknown.root_cause is RootCause.UNCLASSIFIED and unknown.location.line == 14
    assert all(f.stage is Stage.LOGS for f in found)


def test_triton_client_traceback_final_line_classified_once() -> None:
    found = _read("triton_client.log")
    assert len(found) == 1
    f = found[0]
    assert f.code == "LOG002" and f.root_cause is RootCause.DTYPE_OR_RANGE
    assert (f.evidence["got"], f.evidence["expected"], f.evidence["input"]) == (
        "TYPE_INT64",
        "TYPE_INT32",
        "input_ids",
    )
    assert f.location.line == 10


def test_onnxruntime_log() -> None:
    found = _read("onnxruntime.log")
    assert [f.code for f in found] == [
        "LOG006",
        "LOG007",
        "LOG008",
    ]  # "0 errors" and announcing lines are not errors
    dims = found[0]
    assert dims.root_cause is RootCause.DYNAMIC_SHAPE_FIXED
    assert (dims.evidence["index"], dims.evidence["got"], dims.evidence["expected"]) == (0, 8, 1)
    assert found[1].evidence == {**found[1].evidence, "got": "tensor(double)", "expected": "tensor(float)"}
    assert "np.float32" in found[1].fix
    assert (found[2].evidence["got_rank"], found[2].evidence["expected_rank"]) == (3, 4)


def test_torch_onnx_export_log() -> None:
    found = _read("torch_onnx_export.log")
    assert [f.code for f in found] == ["LOG014", "LOG013"]
    op = found[1]
    assert op.root_cause is RootCause.UNSUPPORTED_OP
    assert op.evidence["opset"] == 13 and op.evidence["opset_with_support"] == 14
    assert "opset_version=14" in op.fix
    assert found[0].severity is Severity.WARNING and found[0].root_cause is RootCause.DYNAMIC_SHAPE_FIXED


def test_tensorrt_log() -> None:
    found = _read("tensorrt.log")
    codes = [f.code for f in found]
    assert codes == ["LOG018", "LOG020", "LOG032", "LOG016", "LOG028", "LOG017"]
    tactic = _by_code(found, "LOG032")  # "[W] Skipping tactic ... insufficient memory": a memory warning
    assert tactic.severity is Severity.WARNING and tactic.root_cause is RootCause.MEMORY
    assert _by_code(found, "LOG017").evidence["dtype"] == "INT64"
    assert "int32" in _by_code(found, "LOG017").fix
    override = _by_code(found, "LOG020")
    assert override.evidence["shape"] == "1x3x224x224" and override.root_cause is RootCause.BATCH_DIM_CONFIG
    assert _by_code(found, "LOG028").evidence["count"] == 4  # consequences merged, not reported as causes
    assert "ForeignNode" in _by_code(found, "LOG016").evidence["node"]


def test_vllm_log_with_rank_prefixed_traceback() -> None:
    found = _read("vllm.log")
    assert [f.code for f in found] == ["LOG021", "LOG022", "LOG025"]
    kv = found[0]
    assert kv.root_cause is RootCause.MEMORY
    assert (kv.evidence["max_seq_len"], kv.evidence["kv_cache_tokens"]) == (4096, 3664)
    assert "max_model_len <= 3664" in kv.fix
    assert found[2].evidence == {**found[2].evidence, "prompt_tokens": 5120, "max_model_len": 4096}


def test_transformers_log() -> None:
    found = _read("transformers.log")
    assert [f.code for f in found] == ["LOG024", "LOG023", "LOG012"]
    vlm = found[1]
    # off by one: a processor setting (the CLS token counted for a SigLIP tower) to correct, not a version issue
    assert vlm.root_cause is RootCause.CONFIG_INVALID
    assert (vlm.evidence["image_tokens"], vlm.evidence["image_features"]) == (729, 728)
    assert "num_additional_image_tokens=0" in vlm.fix
    assert found[2].root_cause is RootCause.MEMORY and found[2].evidence["tried"] == "2.00 GiB"


@pytest.mark.parametrize(
    ("expected", "got", "cause", "words"),
    [
        (602112, 150528, RootCause.DTYPE_OR_RANGE, "uint8"),
        (4153344 // 2, 4153344, RootCause.DTYPE_OR_RANGE, "float16"),
        (150528, 50176, RootCause.SHAPE_OR_RANK, "channel"),
        (602112, 401408, RootCause.SHAPE_OR_RANK, "shape"),
    ],
)
def test_byte_ratio_decides_the_root_cause(expected: int, got: int, cause: RootCause, words: str) -> None:
    f = classify_line(f"E0101 00:00:00.1 1 x.cc:1] not enough space: expected {expected}, got {got}")
    assert f is not None and f.code == "LOG001"
    assert f.root_cause is cause and words in f.message


def test_triton_legacy_invalid_size_message() -> None:
    f = classify_line(
        "tensorrtserver.api.InferenceServerException: [ 0] invalid size 4153344 bytes for input "
        "'input/input_data', expects 2076672 bytes"
    )
    assert f is not None and f.evidence["ratio"] == 0.5 and f.root_cause is RootCause.DTYPE_OR_RANGE


def test_profile_on_non_batch_dimension_is_dynamic_shape() -> None:
    f = classify_line("model expected the shape of dimension 1 to be between 1 and 128 but received 512")
    assert f is not None and f.root_cause is RootCause.DYNAMIC_SHAPE_FIXED and "512" in f.fix


def test_unknown_error_is_unclassified_not_forced() -> None:
    found = classify_text(
        learned=False,
        text="2024-01-01 10:00:00 INFO all good\n"
        "2024-01-01 10:00:01 ERROR flux capacitor desynchronised (code 88)\n"
        "2024-01-01 10:00:02 INFO 0 errors since start\n",
    )
    assert len(found) == 1
    assert found[0].code == "LOG000" and found[0].root_cause is RootCause.UNCLASSIFIED
    assert found[0].location.line == 2


def test_traceback_source_lines_are_not_matched() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n'
        '    raise ValueError("Image features and image tokens do not match: tokens: 1, features 2")\n'
        "KeyError: 'pixel_values'\n"
    )
    found = classify_text(text, learned=False)
    assert [f.code for f in found] == ["LOG000"]
    assert "KeyError" in found[0].message


def test_every_rule_has_a_registered_code_and_fix_text() -> None:
    registered = {c.code for c in all_codes()}
    assert {r.code for r in RULES} | {"LOG000"} <= registered
    assert len({r.code for r in RULES}) >= 20


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(logs, [str(LOGS / "vllm.log"), "--format", "json"])
    assert res.exit_code == 1
    data = json.loads(res.output)["findings"]
    assert [d["code"] for d in data] == ["LOG021", "LOG022", "LOG025"]
    assert data[0]["root_cause"] == "memory" and data[0]["stage"] == "logs"
    clean = tmp_path / "ok.log"
    clean.write_text("INFO started\nINFO 0 errors\n")
    assert runner.invoke(logs, [str(clean)]).exit_code == 0
    res = runner.invoke(
        logs,
        ["-"],
        input="WARNING 05-14 x.py:1] ValueError: The decoder prompt (length 9) is longer "
        "than the maximum model length of 8.\n",
    )
    assert res.exit_code == 1 and "LOG025" in res.output


def test_cli_missing_file_is_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(logs, [str(tmp_path / "nope.log")])
    assert isinstance(res.exception, UsageError)
    with pytest.raises(UsageError, match="cannot read log file"):
        raise res.exception


def test_cli_text_keeps_bracketed_system_names() -> None:
    res = CliRunner().invoke(logs, [str(LOGS / "vllm.log")], env={"COLUMNS": "300"})
    assert res.exit_code == 1
    assert "[vllm]" in res.output and "LOG021" in res.output


def test_binary_file_is_refused_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from usg.cli import main

    blob = tmp_path / "model.onnx"
    blob.write_bytes(b"\x08\x07\x12\x00\x00\x01binary\x00payload" * 50)
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "logs", str(blob)])
    assert exc.value.code == 2
    assert "is not a text log: it contains NUL bytes" in capsys.readouterr().err
    undecodable = tmp_path / "latin1.log"
    undecodable.write_bytes(bytes(range(128, 256)) * 20)
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "logs", str(undecodable)])
    assert exc.value.code == 2 and "is not a UTF-8 text log" in capsys.readouterr().err


def test_without_the_doctor_extra_unmatched_errors_say_how_to_match_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.doctor.logs import classify as classify_mod

    monkeypatch.setattr(classify_mod, "default_index", lambda: None)
    [f] = classify_text("ERROR flux capacitor desynchronised")
    assert f.code == "LOG000" and "pip install 'usg[doctor]'" in f.fix


def test_triton_request_shape_without_batch_dim() -> None:
    f = classify_line(
        "InferenceServerException: unexpected shape for input 'pixels' for model 'det'. Expected [-1,3,640,640], "
        "got [3,640,640]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension"
    )
    assert f is not None and f.code == "LOG029" and f.root_cause is RootCause.BATCH_DIM_CONFIG
    assert (f.evidence["expected"], f.evidence["got"]) == ([-1, 3, 640, 640], [3, 640, 640])
    assert "[1, 3, 640, 640]" in f.fix


def test_triton_config_dims_repeating_the_batch_dim() -> None:
    f = classify_line("unexpected shape for input 'x' for model 'm'. Expected [-1,-1,224,3], got [1,224,3]")
    assert f is not None and f.root_cause is RootCause.BATCH_DIM_CONFIG and "remove the leading -1" in f.fix


def test_triton_request_shape_other_mismatch_is_a_shape_problem() -> None:
    f = classify_line("unexpected shape for input 'x' for model 'm'. Expected [-1,3,640,640], got [1,3,384,640]")
    assert f is not None and f.root_cause is RootCause.SHAPE_OR_RANK


def test_image_tokens_zero_means_no_placeholder_in_the_prompt() -> None:
    f = classify_line("ValueError: Image features and image tokens do not match, tokens: 0, features: 576")
    assert f is not None and f.code == "LOG023" and f.root_cause is RootCause.CONFIG_INVALID
    assert "chat template" in f.fix
    cut = classify_line("ValueError: Image features and image tokens do not match: tokens: 500, features 576")
    assert cut is not None and cut.root_cause is RootCause.SHAPE_OR_RANK


def test_ray_serve_replicas_waiting_for_resources() -> None:
    f = classify_line(
        "(ServeController pid=1) WARNING 2024-01-01 10:00:00,000 controller 1 -- Deployment 'Embed' in application "
        "'app' has 2 replicas that have taken more than 30s to be scheduled. This may be due to waiting for the "
        'cluster to auto-scale. Resources required for each replica: {"CPU": 4.0, "GPU": 1.0}, total resources '
        'available: {"CPU": 8.0}. Use `ray status` for more details.'
    )
    assert f is not None and f.code == "LOG030" and f.severity is Severity.WARNING
    assert f.evidence["deployment"] == "Embed" and '"GPU": 1.0' in f.evidence["required"]


def test_python_backend_stub_and_tensorrt_tactics_and_bf16() -> None:
    stub = classify_line("E0101 00:00:00.1 1 python_be.cc:2066] Stub process 'ocr_0_0' is not healthy.")
    assert stub is not None and stub.code == "LOG031" and stub.root_cause is RootCause.ENVIRONMENT
    tactic = classify_line("[W] [TRT] Skipping tactic 2 due to insufficient memory on requested size of 1073741824")
    assert tactic is not None and tactic.code == "LOG032" and tactic.root_cause is RootCause.MEMORY
    bf16 = classify_line(
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
        "Your Quadro RTX 6000 GPU has compute capability 7.5."
    )
    assert bf16 is not None and bf16.code == "LOG033"
    ev = bf16.evidence
    assert (ev["gpu"], ev["compute_capability"], ev["required"]) == ("Quadro RTX 6000", "7.5", "8.0")
    assert "--dtype half" in bf16.fix
