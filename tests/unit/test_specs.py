import numpy as np
import pytest

from usg.specs import Modality, TensorSpec, dtype_name, onnx_type_to_dtype


def test_check_accepts_conforming_array():
    spec = TensorSpec("float32", ("batch", 3, None, None), range=(0, 1), layout="NCHW")
    assert spec.check(np.zeros((2, 3, 8, 9), np.float32)) == []


def test_check_reports_dtype_rank_and_fixed_dim():
    spec = TensorSpec("float32", (None, 3, None, None))
    v = spec.check(np.zeros((8, 8, 3), np.uint8))
    assert any("dtype uint8, expected float32" in s for s in v)
    assert any("rank 3" in s and "expected rank 4" in s for s in v)
    v = spec.check(np.zeros((1, 4, 8, 8), np.float32))
    assert v == ["dim 1 is 4, expected 3 (shape [1, 4, 8, 8] vs [?,3,?,?])"]


def test_symbolic_dims_must_agree_within_a_tensor():
    spec = TensorSpec("float32", ("n", "n"))
    assert spec.check(np.zeros((3, 3), np.float32)) == []
    assert "n" in spec.check(np.zeros((3, 4), np.float32))[0]


def test_range_checked_only_when_declared():
    spec = TensorSpec("float32", None, range=(0, 1))
    assert spec.check(np.array([0.0, 1.0], np.float32)) == []
    (msg,) = spec.check(np.array([0.0, 255.0], np.float32))
    assert msg == "values in [0,255], expected within [0,1]"
    assert TensorSpec("float32").check(np.array([1e9], np.float32)) == []


def test_non_array_is_a_violation():
    assert "got list" in TensorSpec("float32", (2,)).check([1, 2])[0]


@pytest.mark.parametrize(
    ("producer", "consumer", "fragment"),
    [
        (
            TensorSpec("uint8", ("H", "W", 3)),
            TensorSpec("float32", (None, 3, None, None)),
            "dtype uint8 flows into float32",
        ),
        (TensorSpec("float32", (1, 3)), TensorSpec("float32", (1, 4)), "dim 1: 3 flows into fixed 4"),
        (
            TensorSpec("float32", (1, 3), layout="NHWC"),
            TensorSpec("float32", (1, 3), layout="NCHW"),
            "layout",
        ),
        (
            TensorSpec("float32", None, range=(0, 255)),
            TensorSpec("float32", None, range=(0, 1)),
            "range [0,255]",
        ),
    ],
)
def test_edge_compatibility(producer, consumer, fragment):
    assert any(fragment in p for p in producer.compatible_with(consumer))


def test_dict_round_trip_and_helpers():
    spec = TensorSpec.from_dict({"dtype": "float32", "shape": [1, "seq"], "range": [0, 1], "layout": "NC"})
    assert TensorSpec.from_dict(spec.to_dict()) == spec
    assert dtype_name(np.float32) == "float32"
    assert onnx_type_to_dtype("tensor(int64)") == "int64"
    assert Modality("image") is Modality.IMAGE
