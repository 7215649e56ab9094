"""Residual codes of the compact head: quantization bounds, packing, re-ranked recall, storage checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("faiss") is None:
    pytest.skip("usg[index] (faiss-cpu) is not installed", allow_module_level=True)

from usg.errors import InputError
from usg.index.head import Head, fit_head
from usg.index.residual import fit_residual
from usg.index.vectors import VectorSet

D = 64


def spectrum_rows(n: int, seed: int) -> np.ndarray:
    """Unit rows whose energy decays over the components, like a sentence encoder's."""
    rng = np.random.default_rng(seed)
    scale = (1.0 + np.arange(D)) ** -0.75
    basis, _ = np.linalg.qr(np.random.default_rng(99).normal(size=(D, D)))
    x = (rng.normal(size=(n, D)) * scale) @ basis.T
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_top(base: np.ndarray, q: np.ndarray, k: int) -> list[set[int]]:
    return [set(np.argsort(-(base @ row))[:k].tolist()) for row in q]


def test_codes_round_trip_within_half_a_step_and_pack_odd_widths() -> None:
    x = spectrum_rows(3000, 1)
    directions = np.linalg.qr(np.random.default_rng(2).normal(size=(D, 9)))[0]  # 9: 4 at 8 bits, 5 at 4 bits
    rc = fit_residual(x, directions, n8=4)
    assert rc.code_bytes == 4 + 3 and rc.describe() == {"components": 9, "bits": "8x4+4x5", "bytes_per_vector": 7}
    codes = rc.encode(x)
    assert codes.dtype == np.uint8 and codes.shape == (3000, 7)
    r, back = rc.project(x), rc.decode(codes)
    inside = (r >= rc.lo) & (r <= rc.lo + rc.step * np.where(np.arange(9) < 4, 255, 15))
    assert inside.mean() > 0.99  # the clip percentiles leave a sliver outside
    assert np.all(np.abs(back - r)[inside] <= rc.step[np.nonzero(inside)[1]] / 2 + 1e-6)
    # outside the fitted range values clip to the end codes instead of wrapping around
    far = rc.decode(rc.encode(np.full((1, D), 50.0, np.float32)))
    ends = rc.lo + rc.step * np.where(np.arange(9) < 4, 255, 15)
    lo_or_hi = np.isclose(far[0], ends) | np.isclose(far[0], rc.lo)
    assert lo_or_hi.all()


def test_re_ranking_with_residual_codes_recovers_the_full_width_neighbours() -> None:
    base, queries = spectrum_rows(4000, 3), spectrum_rows(50, 4)
    truth = exact_top(base, queries, 10)
    recalls = {}
    for refine in (False, True):
        head = fit_head(base, 8, refine=refine)
        vs = VectorSet(8, head.code_bytes)
        vs.add(np.arange(len(base)), head.apply(base), head.codes(base))
        hits = 0
        for q, want in zip(queries, truth, strict=True):
            ref = (head.residual, head.residual.project(q[None, :])) if head.residual is not None else None
            keys, scores = vs.search(head.apply(q), 10, ref)
            assert list(scores[0]) == sorted(scores[0], reverse=True)
            hits += len(set(keys[0].tolist()) & want)
        recalls[refine] = hits / (10 * len(queries))
    assert recalls[False] < 0.75, recalls  # an 8-d head alone loses many neighbours of this 64-d spectrum
    assert recalls[True] > 0.9, recalls


def test_head_with_residual_saves_loads_and_names_its_codes(tmp_path: Path) -> None:
    x = spectrum_rows(500, 5)
    head, plain = fit_head(x, 16), fit_head(x, 16, refine=False)
    assert head.code_bytes == 16 + 16 and plain.code_bytes == 0 and plain.codes(x).shape == (500, 0)
    assert head.digest != plain.digest  # an index records which codes its vectors carry
    head.save(tmp_path / "h.npz")
    back = Head.load(tmp_path / "h.npz")
    assert back.digest == head.digest and back.describe() == head.describe()
    np.testing.assert_array_equal(back.codes(x), head.codes(x))


def test_vector_set_checks_codes_and_keeps_them_aligned_through_compaction(tmp_path: Path) -> None:
    x = spectrum_rows(400, 6)
    head = fit_head(x, 8)
    vs = VectorSet(8, head.code_bytes)
    with pytest.raises(InputError, match=r"codes: shape \[400, 0\], this set keeps 32 bytes .* fix: pass \[400, 32\]"):
        vs.add(np.arange(400), head.apply(x))
    vs.add(np.arange(400), head.apply(x), head.codes(x))
    vs.remove(np.arange(0, 400, 2))  # half removed: save compacts
    vs.save(tmp_path / "v.npz")
    back = VectorSet.load(tmp_path / "v.npz", 8, head.code_bytes)
    assert len(back) == 200
    assert head.residual is not None
    for key in (1, 151, 399):
        ref = (head.residual, head.residual.project(x[key][None, :]))
        keys, _ = back.search(head.apply(x[key]), 1, ref)
        assert keys[0, 0] == key
    with pytest.raises(InputError, match=r"32 bytes of residual code per vector, the index's head makes 0.*rebuild"):
        VectorSet.load(tmp_path / "v.npz", 8, 0)
