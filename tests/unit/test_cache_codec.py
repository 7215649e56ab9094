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
