"""to_jsonable: every output value becomes something json.dumps carries, or a BackendError naming where
it sits — never a serializer's TypeError after the request ran."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from usg.errors import BackendError
from usg.runtime import to_jsonable


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.array([b"ab", b"c"]), ["ab", "c"]),  # a bytes (S) array: its items decode like bytes do
        (np.bytes_(b"x"), "x"),
        ({"a": [np.array(["t"], dtype=object), np.float32(0.5)]}, {"a": [["t"], 0.5]}),
        (np.array([["a", None]], dtype=object), [["a", None]]),
        ((1, "x", [b"y"]), [1, "x", ["y"]]),
    ],
)
def test_values_json_carries_come_out_json_ready(value: Any, expected: Any):
    out = to_jsonable(value)
    assert out == expected
    json.dumps(out)


@pytest.mark.parametrize(
    ("value", "where", "kind"),
    [
        (np.array([1 + 2j]), "output 'y'[0]", "complex"),
        (np.complex64(1 + 1j), "output 'y'", "complex"),
        ({"boxes": [[1, 2], np.array(["2020-01-01"], dtype="datetime64[D]")]}, "output 'y'.boxes[1][0]", "date"),
        ([0, 1, {"s": {1, 2}}], "output 'y'[2].s", "set"),
        (np.array([[None, object()]], dtype=object), "output 'y'[0][1]", "object"),
    ],
)
def test_a_value_json_cannot_carry_is_named_with_where_it_sits(value: Any, where: str, kind: str):
    with pytest.raises(BackendError) as info:
        to_jsonable(value, "output 'y'")
    assert str(info.value).startswith(f"{where} is a {kind}, which JSON cannot carry; fix:")


def test_the_v2_and_generate_answers_name_the_output_json_cannot_carry():
    """/v2 (and gRPC) said 'output is a set', /generate 'output.y is a set': not the output's name."""
    from usg.runtime import InferResult
    from usg.serve.generate import response_body
    from usg.serve.oip import to_v2_output

    with pytest.raises(BackendError, match=r"^output 'y' is a set, which JSON cannot carry"):
        to_v2_output({1, 2}, "y")
    with pytest.raises(BackendError, match=r"^output 'y'\[1\] is a set, which JSON cannot carry"):
        to_v2_output(["a", {1, 2}], "y")
    from usg.graph import GraphBuilder

    graph = GraphBuilder("g").input("text", "text").node("n", fn="testops:upper", inputs={"text": "inputs.text"})
    graph = graph.output("y", "n.text").build()
    with pytest.raises(BackendError, match=r"^output 'y' is a set, which JSON cannot carry"):
        response_body(graph, InferResult({"y": {1, 2}}))
