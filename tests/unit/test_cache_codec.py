"""The node-cache codec: values round-trip without pickle; anything malformed is a CodecError."""

import io
import pickle

import numpy as np
import pytest

from usg.cache import CodecError, MemoryStore, decode, encode
from usg.cache.key import canonical_digest

KEY = "a" * 64


def test_values_round_trip_with_their_types():
    value = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
        "ids": [np.array([1, 2], np.int64), np.zeros((0, 3), np.uint8)],
        "meta": {1: (2.5, "s"), "n": None, "b": b"\x00\x01", "flag": True},
        "scalar": np.float32(1.5),
        "text": ["é", ""],
    }
    back = decode(KEY, encode(KEY, value))
    np.testing.assert_array_equal(back["x"], value["x"])
    assert back["x"].dtype == np.float32
    assert back["ids"][1].shape == (0, 3) and back["ids"][1].dtype == np.uint8
    assert back["meta"] == {1: (2.5, "s"), "n": None, "b": b"\x00\x01", "flag": True}
    assert isinstance(back["scalar"], np.float32) and back["scalar"] == np.float32(1.5)
    assert back["text"] == ["é", ""]


def test_object_arrays_and_custom_objects_are_not_cacheable():
    with pytest.raises(CodecError, match="object array"):
        encode(KEY, {"x": np.array([object()], dtype=object)})
    with pytest.raises(CodecError, match="not cacheable"):
        encode(KEY, {"x": object()})


def test_a_pickle_or_garbage_in_the_store_is_a_codec_error_never_executed():
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    for data in (pickle.dumps(Boom()), b"", b"USGC1" + b"\xff" * 20, encode(KEY, {"a": 1})[:-3]):
        with pytest.raises(CodecError):
            decode(KEY, data)
    # an .npy of an object array inside a well-formed frame: np.load refuses it (no pickle)
    good = encode(KEY, {"a": np.zeros(2)})
    buf = io.BytesIO()
    np.save(buf, np.array([Boom()], dtype=object), allow_pickle=True)
    head = good[: good.index(b"\x93NUMPY") - 8]
    poisoned = head + len(buf.getvalue()).to_bytes(8, "little") + buf.getvalue()
    with pytest.raises(CodecError, match="do not decode"):
        decode(KEY, poisoned)


def test_a_value_read_back_under_another_key_is_rejected():
    with pytest.raises(CodecError, match="another key"):
        decode("b" * 64, encode(KEY, {"a": 1}))


def test_canonical_digest_covers_dtype_shape_and_bytes():
    a = np.zeros((2, 3), np.float32)
    assert canonical_digest(a) != canonical_digest(a.astype(np.float64))
    assert canonical_digest(a) != canonical_digest(a.reshape(3, 2))
    assert canonical_digest(a) == canonical_digest(np.zeros((2, 3), np.float32))
    assert canonical_digest([1, "a"]) != canonical_digest(("1", "a"))
    assert len(canonical_digest(a)) == 64  # full 256 bits


def test_memory_store_evicts_least_recently_used_within_its_byte_bound():
    store = MemoryStore(max_bytes=250)
    for k in "abc":
        store.put_now(k, b"x" * 100)
    assert store.get_now("a") is None  # evicted: 300 > 250
    assert store.stats.evictions == 1 and store.stats.bytes_held == 200
    store.get_now("b")  # b is now the most recent
    store.put_now("d", b"y" * 100)
    assert store.get_now("c") is None and store.get_now("b") is not None
    store.put_now("huge", b"z" * 1000)  # larger than the bound: not kept, nothing evicted for it
    assert store.get_now("huge") is None and store.stats.bytes_held == 200


def _frame(header: bytes, arrays: bytes = b"") -> bytes:
    """A stored value with this JSON header and these array frames (as a store could hold them)."""
    return b"USGC1" + len(header).to_bytes(8, "little") + header + arrays


def _npy_frame(descr: str, shape: tuple[int, ...], body: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    npy = buf.getvalue() + body
    return len(npy).to_bytes(8, "little") + npy


@pytest.mark.parametrize(
    ("data", "match"),
    [
        # nested past the interpreter's recursion limit: in the JSON text, and in the value tree
        (_frame(b"[" * 100_000 + b"]" * 100_000), "RecursionError"),
        (_frame(b'{"key":"' + KEY.encode() + b'","value":' + b"[" * 900 + b"]" * 900 + b"}"), "RecursionError"),
        (_frame(b'{"key":"' + KEY.encode() + b'","value":' + b'{"$t":[' * 600 + b"]}" * 600 + b"}"), "Recursion"),
        # an array header that declares 4 TiB over 8 bytes: refused before anything is allocated
        (
            _frame(b'{"key":"' + KEY.encode() + b'","value":{"$a":0}}', _npy_frame("<f4", (1 << 40,), b"\0" * 8)),
            r"declares shape \(1099511627776,\) float32 \(4398046511104 bytes\) but 8 bytes follow",
        ),
        (
            _frame(b'{"key":"' + KEY.encode() + b'","value":{"$a":0}}', _npy_frame("<f4", (4,), b"\0" * 8)),
            r"declares shape \(4,\) float32 \(16 bytes\) but 8 bytes follow",
        ),
        (
            _frame(b'{"key":"' + KEY.encode() + b'","value":{"$a":0}}', (0).to_bytes(8, "little")),
            "reading magic string",
        ),
    ],
    ids=["deep-json", "deep-lists", "deep-tuples", "forged-huge-shape", "short-array", "empty-array-frame"],
)
def test_hostile_stored_values_are_codec_errors_never_a_crash(data: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        decode(KEY, data)


def test_an_array_whose_header_matches_its_bytes_still_decodes() -> None:
    data = _frame(b'{"key":"' + KEY.encode() + b'","value":{"$a":0}}', _npy_frame("<f4", (2,), b"\0" * 8))
    np.testing.assert_array_equal(decode(KEY, data), np.zeros(2, np.float32))
