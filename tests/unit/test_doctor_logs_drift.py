"""LOG034: numerical drift between frameworks reaches classification, with the numbers and frameworks as evidence.

The phrasings below are written for these tests (none is copied from the labelled corpus).
"""

from __future__ import annotations

import pytest

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text
from usg.doctor.logs.rules_drift import drift_evidence


def _drift(text: str):
    found = [f for f in classify_text(text, learned=False) if f.code == "LOG034"]
    return found[0] if found else None


@pytest.mark.parametrize(
    "text",
    [
        "The ONNX model's outputs are different from the PyTorch ones after export.",
        "my TensorRT engine gives results that differ from torch by a lot",
        "Results differ between OpenVINO and ONNX Runtime on the same image",
        "predictions are completely wrong once the model runs in fp16 on TensorRT",
        "AssertionError: Tensor-likes are not close!",
        "Mismatched elements: 37 / 1000 (3.7%)",
        "Not equal to tolerance rtol=0.001, atol=1e-05",
        "np.allclose(torch_out, ort_out) returns False",
        "max abs diff: 0.0421 between eager and the exported graph",
        "Top-1 accuracy dropped from 76.1% to 12.4% after converting to TensorRT INT8",
        "we see a large drop in accuracy with the quantized OpenVINO IR",
        "I get different outputs from PyTorch and ONNX Runtime for the second input",
        "getting wrong results when serving the converted model",
        "the TensorRT engine's logits don't match the eager model",
    ],
)
def test_drift_phrasings_are_classified(text: str) -> None:
    f = _drift(text)
    assert f is not None, text
    assert f.root_cause is RootCause.OP_SEMANTIC_DRIFT
    assert f.evidence["confidence"] > 0.5


@pytest.mark.parametrize(
    "text",
    [
        # a shape, dtype or count mismatch of outputs belongs to other rules (or stays unclassified), not to drift
        "the output shapes are different: expected [1, 10] got [1, 12]",
        "number of outputs differs between the config and the model",
        "outputs mismatch dtype: FP16 vs FP32",
        # a tracer's caveat is a hypothetical, not a report of drift
        "TracerWarning: Converting a tensor to a list might cause the trace to be incorrect and give wrong results.",
        "INFO: all 12 outputs match the reference within atol 1e-4",
    ],
)
def test_non_drift_lines_are_not_drift(text: str) -> None:
    assert _drift(text) is None, text


def test_evidence_carries_numbers_and_frameworks() -> None:
    f = _drift(
        "max absolute difference 3.2e-3 (max relative difference 0.15) between PyTorch and ONNX Runtime, atol 1e-05"
    )
    assert f is not None
    ev = f.evidence
    assert ev["max_abs_diff"] == pytest.approx(3.2e-3)
    assert ev["max_rel_diff"] == pytest.approx(0.15)
    assert ev["tolerance"] == pytest.approx(1e-5)
    assert ev["frameworks"] == ["PyTorch", "ONNX Runtime"]
    assert "between PyTorch and ONNX Runtime" in f.message and "0.0032" in f.message


def test_evidence_accuracy_and_precision() -> None:
    ev = drift_evidence("accuracy went down from 91.5% to 40.2% with the INT8 OpenVINO model")
    assert ev["accuracy_before"] == pytest.approx(91.5) and ev["accuracy_after"] == pytest.approx(40.2)
    assert ev["precision"] == "int8" and ev["frameworks"] == ["OpenVINO"]
    mismatch = drift_evidence("Mismatched elements: 5 / 640 (0.8%)\nGreatest absolute difference: 0.5")
    assert mismatch["mismatched_elements"] == 5 and mismatch["total_elements"] == 640


def test_drift_line_inside_a_log_is_the_root_error() -> None:
    log = (
        "2026-01-02 10:00:01 INFO exporting model to model.onnx\n"
        "2026-01-02 10:00:09 INFO export done, comparing with eager\n"
        "2026-01-02 10:00:10 WARNING the output of the ONNX model is quite different from PyTorch: max abs diff 0.73\n"
    )
    found = classify_text(log, learned=False)
    root = [f for f in found if f.evidence.get("root_error")]
    assert [f.code for f in root] == ["LOG034"]
    assert root[0].evidence["max_abs_diff"] == pytest.approx(0.73)
    assert root[0].location.line == 3
