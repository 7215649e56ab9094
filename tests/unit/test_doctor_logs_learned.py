"""The learned layer of `usg doctor logs`: unseen phrasings, nearest known cases, root error of long logs."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from usg.doctor.findings import RootCause, Severity
from usg.doctor.logs import classify as classify_mod
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import load_corpus
from usg.doctor.logs.model import DEFAULT_CALIBRATION
from usg.doctor.logs.similar import CaseIndex, message_evidence

CORPUS_URLS = {c.url for c in load_corpus()}


def test_unseen_phrasing_gets_class_confidence_evidence_and_known_cases() -> None:
    # not a corpus excerpt and no rule knows it: an SGLang-style KV-cache shortage in new words (not the
    # "not enough memory" wording LOG059 reads)
    line = (
        "[2025-01-02 10:00:00 TP0] RuntimeError: Too little memory to hold the KV cache of 4096 tokens. "
        "Please try a smaller --max-total-tokens or increase --mem-fraction-static."
    )
    assert line not in {c.excerpt for c in load_corpus()}
    [f] = classify_text(line, "server.log")
    assert f.code == "LOG050" and f.root_cause is RootCause.MEMORY and f.severity is Severity.ERROR
    assert DEFAULT_CALIBRATION.threshold <= f.evidence["confidence"] <= 1.0
    assert f.evidence["numbers"][:1] == ["2025"] and "4096" in f.evidence["numbers"]
    assert f.evidence["causal_line"].startswith("[2025-01-02")
    cases = f.evidence["similar_cases"]
    assert cases and all(c["url"] in CORPUS_URLS and c["root_cause"] == "memory" for c in cases)
    assert cases[0]["url"] in f.message and "resolved by:" in f.fix
    assert f.evidence["root_error"] is True


def test_engine_warning_recognised_by_known_cases_stays_a_warning() -> None:
    [f] = classify_text("[W] [TRT] Tactic Device request: 2048MB Available: 1024MB. Device memory is insufficient.")
    assert (f.code, f.severity, f.root_cause) == ("LOG050", Severity.WARNING, RootCause.MEMORY)


def test_rule_findings_carry_confidence_and_similar_cases() -> None:
    msg = (
        "InvalidArgument: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Unexpected input data type. "
        "Actual: (tensor(int32)) , expected: (tensor(int64))"
    )
    [f] = classify_text(msg)
    assert f.code == "LOG007" and f.evidence["confidence"] == classify_mod.RULE_CONFIDENCE
    assert f.evidence["similar_cases"][0]["root_cause"] == "dtype_or_range"


def test_a_project_left_out_is_still_recognised_from_the_others() -> None:
    index = CaseIndex(load_corpus(exclude_projects=["sglang"]))
    assert all(c.project != "sglang" for c in index.cases)
    [f] = classify_text("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", index=index)
    assert f.root_cause is RootCause.MEMORY
    assert all("sgl-project" not in c["url"] for c in f.evidence["similar_cases"])


def test_far_from_every_case_stays_unclassified() -> None:
    [f] = classify_text("2024-01-01 10:00:01 ERROR flux capacitor desynchronised (code 88)")
    assert f.code == "LOG000" and f.root_cause is RootCause.UNCLASSIFIED
    assert f.evidence["confidence"] < DEFAULT_CALIBRATION.threshold


def _triton_startup(n: int) -> list[str]:
    return [
        f"I1203 10:00:{i % 60:02d}.{i:06d} 1 grpc_server.cc:{200 + i}] Ready for RPC 'Handler{i}', {i}"
        for i in range(n)
    ]


def test_long_triton_log_reports_the_first_root_error_not_the_cascade() -> None:
    lines = _triton_startup(300)
    lines.insert(
        150,
        "E1203 10:00:30.000001 1 model_lifecycle.cc:626] failed to load 'resnet' version 1: Invalid argument: "
        "model 'resnet', tensor 'input': the model expects 4 dimensions (shape [-1,3,224,224]) but the model "
        "configuration specifies 3 dimensions (shape [3,224,224])",
    )
    lines += [
        "I1203 10:01:00.000000 1 server.cc:307] Waiting for in-flight requests to complete.",
        "error: creating server: Internal - failed to load all models",
        "E1203 10:01:01.000000 1 server.cc:250] Shutting down, failed to load all models",
    ]
    findings = classify_text("\n".join(lines), "triton.log")
    root = root_error(findings)
    assert root is not None and root.code == "LOG005" and root.location.line == 151
    assert [f for f in findings if f.evidence.get("root_error")] == [root]
    assert all(f.location.line > 300 for f in findings if f is not root)  # the cascade comes after, unpromoted


def test_vllm_traceback_root_error_is_the_kv_cache_shortage() -> None:
    noise = [f"INFO 08-20 03:09:{i % 60:02d} [gpu_model_runner.py:{i}] step {i} ok" for i in range(320)]
    trace = [
        "ERROR 08-20 03:10:01 [core.py:586] EngineCore failed to start.",
        "ERROR 08-20 03:10:01 [core.py:586] Traceback (most recent call last):",
        'ERROR 08-20 03:10:01 [core.py:586]   File "/usr/lib/python3/vllm/v1/engine/core.py", line 577, in run',
        "ERROR 08-20 03:10:01 [core.py:586]     engine_core = EngineCoreProc(*args, **kwargs)",
        "ERROR 08-20 03:10:01 [core.py:586] ValueError: To serve at least one request with the models's max seq "
        "len (32768), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.31 GiB). "
        "Based on the available memory, the estimated maximum model length is 18928.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    findings = classify_text("\n".join(noise + trace), "vllm.log")
    root = root_error(findings)
    assert root is not None and root.root_cause is RootCause.MEMORY
    assert root.location.line > 320 and "Engine core initialization failed" not in root.message


def test_message_evidence_extracts_names_shapes_dtypes_and_quantities() -> None:
    ev = message_evidence("tensor 'input_ids': expected tensor(int64) of shape [1, 128], 2.00 GiB free")
    assert ev["names"] == ["input_ids"] and ev["shapes"] == ["[1, 128]"]
    assert "tensor(int64)" in ev["dtypes"] and ev["quantities"] == ["2.00 GiB"]


def test_a_cascade_line_is_never_given_a_class_by_the_learned_layer() -> None:
    # Triton's start-up cascade after a model failed: it states a consequence, not a cause; the root
    # error is the message before it, whatever the learned layer makes of that message.
    log = (
        "I1203 10:00:00.000000 1 model_lifecycle.cc:300] loading: model_0:1\n"
        "E1203 10:00:59.000000 1 model_lifecycle.cc:600] something the operator wrote by hand went sideways\n"
        "E1203 10:01:00.000000 1 model_repository_manager.cc:1186] failed to load all models\n"
        "error: creating server: Internal - failed to load all models"
    )
    findings = classify_text(log, "server.log")
    cascade = [f for f in findings if "failed to load all models" in f.evidence["line_text"]]
    assert cascade and all(f.code == "LOG000" and f.evidence.get("cascade") for f in cascade)
    root = root_error(findings)
    assert root is not None and root.location.line == 2
