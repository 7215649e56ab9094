"""A model node's input contract check, remembered per dtype/shape signature (usg.runtime.contract.InputCheck)."""

from __future__ import annotations

import numpy as np
import pytest

from usg.errors import ContractError
from usg.runtime.contract import InputCheck
from usg.specs import TensorSpec


def test_a_signature_that_passed_is_not_checked_again_and_a_new_one_is() -> None:
    check = InputCheck("vad", "silero", {"input": TensorSpec("float32", ("n", 576)), "sr": TensorSpec("int64", ())})
    item = {"input": np.zeros((1, 576), np.float32), "sr": np.array(16000, np.int64)}
    check(item)
    check(item)
    assert len(check._seen) == 1
    with pytest.raises(ContractError, match=r"input 'input': got float64\[1, 576\]"):
        check({**item, "input": np.zeros((1, 576))})
    with pytest.raises(ContractError, match=r"dim 1 is 512, expected 576"):
        check({**item, "input": np.zeros((1, 512), np.float32)})
    assert len(check._seen) == 1  # failures are not remembered


def test_symbolic_dims_shared_by_two_inputs_are_still_bound_together() -> None:
    specs = {"a": TensorSpec("float32", ("n", "t")), "b": TensorSpec("float32", ("n", "t"))}
    check = InputCheck("m", "m", specs)
    check({"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 4), np.float32)})
    with pytest.raises(ContractError, match=r"axis 1 \(t\) is 5 but input 'a' has t=4"):
        check({"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 5), np.float32)})


def test_a_spec_with_a_range_is_checked_every_time() -> None:
    check = InputCheck("m", "m", {"x": TensorSpec("float32", ("n",), range=(0.0, 1.0))})
    check({"x": np.full(3, 0.5, np.float32)})
    with pytest.raises(ContractError, match=r"values in \[2,2\], expected within \[0,1\]"):
        check({"x": np.full(3, 2.0, np.float32)})
