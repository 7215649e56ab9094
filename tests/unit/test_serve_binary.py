"""The v2 tensor codec against tritonclient's own encoder and decoder."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="needs the serve extra: pip install -e '.[serve]'")

import json
import re

import numpy as np

pytest.importorskip("starlette", reason="needs the serve extra: pip install 'usg[serve]'")


from usg.errors import InputError
from usg.serve.binary import (
    decode_bytes_elements,
    decode_tensor,
    dtype_to_datatype,
    encode_bytes_elements,
    encode_response,
    split_body,
)
from usg.serve.v2 import to_v2_output


def test_bytes_elements_round_trip_and_match_tritonclient() -> None:
    pytest.importorskip("tritonclient.utils", reason="needs the triton extra: pip install 'usg[triton]'")
    from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

    items = [b"", b"hello", "ünï".encode(), bytes(range(256))]
    raw = encode_bytes_elements(items)
    assert raw == serialize_byte_tensor(np.array(items, dtype=object)).item()
    assert decode_bytes_elements(raw, "t") == items
    assert list(deserialize_bytes_tensor(raw)) == items


def test_truncated_bytes_elements_say_where() -> None:
    with pytest.raises(InputError, match="ends inside an element length at offset 0"):
        decode_bytes_elements(b"\x01\x00", "t")


def test_tritonclient_request_body_decodes() -> None:
    th = pytest.importorskip("tritonclient.http", reason="needs the triton extra: pip install 'usg[triton]'")
    from tritonclient.http._utils import _get_inference_request

    text = th.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi there"], dtype=object))
    x = th.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = th.InferInput("y", [2], "INT64")
    y.set_data_from_numpy(np.array([7, 8], dtype=np.int64), binary_data=False)
    body, json_size = _get_inference_request([text, x, y], "rid", None, 0, False, False, 0, None, None)
    header, tail = split_body(body, str(json_size))
    assert header["parameters"] == {"binary_data_output": True}
    offset = 0
    got = {}
    for entry in header["inputs"]:
        t, offset = decode_tensor(entry, tail, offset)
        got[t.name] = t
    assert offset == len(tail)
    assert got["text"].value == [b"hi there"]
    np.testing.assert_array_equal(got["x"].value, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(got["y"].value, [7, 8])


def test_binary_response_decodes_with_tritonclient() -> None:
    pytest.importorskip("tritonclient.http", reason="needs the triton extra: pip install 'usg[triton]'")
    from tritonclient.http import InferResult

    emb = np.random.default_rng(0).standard_normal((1, 384)).astype(np.float32)
    lines = [{"text": "INVOICE", "score": 0.9, "box": [[0.0, 1.0]]}, {"text": "x", "score": 0.5, "box": []}]
    tensors = []
    for name, value, binary in (("lines", lines, True), ("emb", emb, True), ("label", "ok", False)):
        datatype, shape, v = to_v2_output(value)
        tensors.append(({"name": name, "datatype": datatype, "shape": shape}, v, binary))
    body, hlen = encode_response({"model_name": "m", "id": "1"}, tensors)
    assert hlen is not None
    result = InferResult.from_response_body(body, header_length=hlen)
    np.testing.assert_array_equal(result.as_numpy("emb"), emb)
    decoded = [json.loads(x) for x in result.as_numpy("lines")]
    assert decoded == lines
    assert result.as_numpy("label").tolist() == ["ok"]  # JSON BYTES come back as str


def test_json_only_response_has_no_header_length() -> None:
    body, hlen = encode_response(
        {"id": "1"},
        [({"name": "a", "datatype": "FP32", "shape": [2]}, np.array([1.5, 2.5], np.float32), False)],
    )
    assert hlen is None
    assert json.loads(body)["outputs"][0]["data"] == [1.5, 2.5]


@pytest.mark.parametrize(
    ("value", "datatype", "shape"),
    [
        (np.zeros((2, 3), np.float16), "FP16", [2, 3]),
        (np.int64(3), "INT64", [1]),
        (True, "BOOL", [1]),
        ("s", "BYTES", [1]),
        (["a", "b"], "BYTES", [2]),
        ({"k": 1}, "BYTES", [1]),
        (np.array(["a", "bc"]), "BYTES", [2]),
    ],
)
def test_output_mapping(value: object, datatype: str, shape: list[int]) -> None:
    got_type, got_shape, _ = to_v2_output(value)
    assert (got_type, got_shape) == (datatype, shape)


def test_dtype_names() -> None:
    assert dtype_to_datatype("float32") == "FP32"
    assert dtype_to_datatype("str") == "BYTES"
    assert dtype_to_datatype(None) == "BYTES"
    assert dtype_to_datatype(np.dtype("uint8")) == "UINT8"


@pytest.mark.parametrize("shape", [[1], [2, 2]])
def test_bytes_elements_past_the_shape_are_refused_before_they_are_split(shape: list[int]) -> None:
    """4 MiB of 2-byte elements is ~700k bytes objects (~7x the data): the shape says how many
    elements there are, so splitting stops at the first one past it."""
    import tracemalloc

    raw = encode_bytes_elements([b"ab"] * ((4 << 20) // 6))
    entry = {"name": "text", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": len(raw)}}
    n = int(np.prod(shape))
    tracemalloc.start()
    try:
        with pytest.raises(
            InputError,
            match=rf"inputs\.text: BYTES data holds more than the {n} elements? of shape {re.escape(str(shape))}"
            rf" \(element {n + 1} starts at offset {6 * n}\); fix: make shape match",
        ):
            decode_tensor(entry, memoryview(raw), 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(raw) // 4, peak  # was ~7x len(raw): every element split before the count was checked
