"""The linear layer of `usg doctor logs`: features, calibrated confidence, nested-style calibration."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from usg.doctor.findings import RootCause
from usg.doctor.logs.corpus import LabelledCase
from usg.doctor.logs.model import WRONG_COST, Calibration, LinearLayer, calibrate, value_features


def _case(project: str, cause: RootCause, text: str) -> LabelledCase:
    return LabelledCase(f"https://github.com/o/{project}/issues/1", project, cause, "fix", False, text)


MEM = RootCause.MEMORY
DT = RootCause.DTYPE_OR_RANGE
CASES = [
    _case("a", MEM, "CUDA out of memory. Tried to allocate 2.00 GiB"),
    _case("a", DT, "Unexpected input data type. Actual: (tensor(int32)) , expected: (tensor(int64))"),
    _case("b", MEM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0)"),
    _case("b", DT, "unexpected datatype TYPE_FP32 for input 'x', expecting TYPE_FP16"),
    _case("c", MEM, "RuntimeError: not enough memory: you tried to allocate 8 GiB"),
    _case("c", DT, "expected dtype int64 but got float32 for input_ids"),
]


def test_value_features_name_the_kinds_of_values_a_message_states() -> None:
    flags = value_features("tensor 'x' of shape [1, 3] is tensor(float16), 2.00 GiB, built with 8.6.1 at /a/b/c.so")
    assert flags[:6] == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert value_features("something broke") == [0.0] * len(flags)


def test_linear_layer_classifies_unseen_phrasing_with_a_probability() -> None:
    layer = LinearLayer(CASES, Calibration(temperature=4.0, threshold=0.5))
    probs = layer.probabilities("RuntimeError: CUDA out of memory while allocating 1.5 GiB")
    assert abs(sum(probs.values()) - 1.0) < 1e-9 and set(probs) == {MEM, DT}
    cause, conf = layer.predict("RuntimeError: CUDA out of memory while allocating 1.5 GiB")
    assert cause is MEM and conf == probs[MEM] > 0.5


def test_below_the_threshold_the_layer_abstains() -> None:
    layer = LinearLayer(CASES, Calibration(temperature=4.0, threshold=0.999))
    cause, conf = layer.predict("memory data type")
    assert cause is None and 0.5 <= conf < 0.999


def test_one_class_is_refused_with_the_count() -> None:
    with pytest.raises(ValueError, match="at least 2 classes, got 1"):
        LinearLayer(CASES[::2])


def test_calibration_uses_out_of_fold_scores_and_the_wrong_cost() -> None:
    fitted: list[set[str]] = []

    def fit(train: list[LabelledCase]) -> LinearLayer:
        fitted.append({c.project for c in train})
        return LinearLayer(train)

    cal = calibrate(CASES, fit)
    assert sorted(map(sorted, fitted)) == [["a", "b"], ["a", "c"], ["b", "c"]]  # each project left out once
    assert cal.temperature > 0 and 0.2 <= cal.threshold <= 0.9
    assert WRONG_COST == 3.0
    # no case reaches the layer: every threshold costs nothing, the lowest is kept
    assert calibrate(CASES, LinearLayer, lambda c: False).threshold == 0.2
