"""Node functions around align nodes: paired items, flatten / unflatten, results attached per key item."""

from __future__ import annotations

import numpy as np
import pytest

from usg.errors import InputError
from usg.ops.aligned import attach, flatten, paired, present, unflatten

SEG = [
    {"start_ms": 0.0, "end_ms": 900.0},
    {"start_ms": 2000.0, "end_ms": 2500.0},
    {"start_ms": 4000.0, "end_ms": 4400.0},
]
TUPLES = [
    {"audio": SEG[0], "frame": {"image": "img0", "ts_ms": 100.0}, "ts_ms": 0.0, "skew_ms": 100.0, "missing": []},
    {"audio": None, "frame": {"image": "img1", "ts_ms": 1000.0}, "ts_ms": 1000.0, "skew_ms": 0.0, "missing": ["audio"]},
    {"audio": SEG[1], "frame": None, "ts_ms": 2000.0, "skew_ms": 0.0, "missing": ["frame"]},
    {"audio": SEG[2], "frame": {"image": "img2", "ts_ms": 3900.0}, "ts_ms": 3900.0, "skew_ms": 100.0, "missing": []},
]


def test_paired_takes_the_partner_field_of_complete_tuples_in_order() -> None:
    out = paired(TUPLES, key="audio", partner="frame", field="image")
    assert out == {"items": ["img0", "img2"], "keys": [SEG[0], SEG[2]]}
    with pytest.raises(InputError, match=r"aligned 'frame' item has no 'pixels'; fix: give frame items a 'pixels'"):
        paired(TUPLES, key="audio", partner="frame", field="pixels")


def test_flatten_and_unflatten_are_inverse_and_check_the_counts() -> None:
    lists = [[1, 2], [], [3]]
    flat = flatten(lists)
    assert flat == {"items": [1, 2, 3], "counts": [2, 0, 1]}
    assert unflatten(flat["items"], flat["counts"]) == {"lists": lists}
    with pytest.raises(InputError, match=r"unflatten: 2 items for counts summing to 3"):
        unflatten([1, 2], [2, 0, 1])


def test_attach_gives_one_row_per_segment_with_the_text_and_vector_of_its_frame() -> None:
    v = np.ones((1, 4), np.float32)
    out = attach(TUPLES, ["Slide one", None], [v], key="audio", partner="frame")
    assert out["rows"] == [
        {"start_ms": 0.0, "end_ms": 900.0, "frame_ts_ms": 100.0, "skew_ms": 100.0, "text": "Slide one"},
        {"start_ms": 2000.0, "end_ms": 2500.0, "frame_ts_ms": None, "skew_ms": None, "text": None},
        {"start_ms": 4000.0, "end_ms": 4400.0, "frame_ts_ms": 3900.0, "skew_ms": 100.0, "text": None},
    ]
    assert out["values"][0].shape == (4,) and out["values"][1:] == [None, None]
    assert present(["a", None, "", "b"]) == {"texts": ["a", "b"]}
