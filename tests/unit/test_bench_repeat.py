"""``usg bench --repeat-rate R``: a share R of requests repeats an input already sent, the rest are new."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

from usg.bench.samples import Sample, fresh_variant, repeat_sampler
from usg.errors import UsageError


def _key(s: Sample) -> str:
    h = hashlib.sha256()
    if s.image is not None:
        h.update(s.image.tobytes())
    h.update((s.text or "").encode())
    return h.hexdigest()


def _samples() -> list[Sample]:
    img = np.full((8, 8, 3), 200, np.uint8)
    return [Sample("a", image=img), Sample("b", text="total due"), Sample("c", image=img.copy(), text="x")]


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9])
def test_the_share_of_repeats_is_the_rate_and_fresh_inputs_are_never_seen_before(rate: float) -> None:
    drawn = list(itertools.islice(repeat_sampler(_samples(), rate, seed=1), 2000))
    seen: set[str] = set()
    repeats = 0
    for s in drawn:
        k = _key(s)
        repeats += k in seen
        seen.add(k)
    assert repeats / len(drawn) == pytest.approx(rate, abs=0.04)


def test_a_fresh_variant_differs_in_bytes_not_in_content() -> None:
    a = _samples()[2]
    v = fresh_variant(a, 7)
    assert v.image is not None and a.image is not None
    diff = np.abs(v.image.astype(int) - a.image.astype(int))
    assert diff.max() == 1 and diff.sum() == bin(8).count("1")  # n + 1 = 8 in the lowest bits
    assert v.text == "x #7" and _key(v) != _key(a)


def test_a_rate_outside_0_1_is_refused() -> None:
    with pytest.raises(UsageError, match=r"--repeat-rate 1\.5"):
        next(repeat_sampler(_samples(), 1.5))
