"""vad_windows: a stream cut into chunks anywhere gives the windows (and their times) of the whole."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from usg.errors import InputError
from usg.ops.vad_stream import vad_windows

RATE = 16_000


def _chunked(x: np.ndarray, cuts: list[int], rate: int) -> tuple[list[np.ndarray], list[list[float]], dict[str, Any]]:
    st: dict[str, Any] = {}
    frames: list[np.ndarray] = []
    times: list[list[float]] = []
    lo = 0
    for hi in [*cuts, x.shape[0]]:
        out = vad_windows(x[lo:hi], rate, session_state=st, ts_ms=1000.0 + lo * 1000 / rate, flush=False)
        frames += out["frames"]
        times += out["times"]
        lo = hi
    last = vad_windows(np.zeros(0, np.float32), rate, session_state=st, ts_ms=1000.0 + lo * 1000 / rate, flush=True)
    return frames + last["frames"], times + last["times"], st


@pytest.mark.parametrize("rate", [16_000, 8_000])
@pytest.mark.parametrize("seed", range(6))
def test_chunks_cut_anywhere_give_the_windows_of_the_whole(rate: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, int(rate * rng.uniform(0.05, 1.3))).astype(np.float32)
    # chunk sizes from a tenth of a window to several windows, and empty chunks
    cuts = sorted(int(c) for c in rng.integers(0, x.shape[0], int(rng.integers(0, 40))))
    whole = vad_windows(x, rate, session_state={}, ts_ms=1000.0, flush=True)
    frames, times, st = _chunked(x, cuts, rate)
    window, context = (512, 64) if rate == 16_000 else (256, 32)
    assert len(frames) == len(whole["frames"]) == -(-x.shape[0] // window)
    for got, ref in zip(frames, whole["frames"], strict=True):
        assert got.shape == (1, context + window) and got.dtype == np.float32
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(frames[0][0, :context], np.zeros(context, np.float32))
    np.testing.assert_array_equal(np.concatenate([f[0, context:] for f in frames])[: x.shape[0]], x)
    assert [t[0] for t in times] == [t[0] for t in whole["times"]] == [i * window for i in range(len(frames))]
    np.testing.assert_allclose([t[1] for t in times], [t[1] for t in whole["times"]], atol=1e-6)
    assert st["pos"] == len(frames) * window and st["rest"].shape == (0,)


def test_a_short_chunk_waits_for_the_next_and_a_bad_one_is_refused() -> None:
    st: dict[str, Any] = {}
    x = np.arange(700, dtype=np.float32) / 700
    out = vad_windows(x[:300], session_state=st, ts_ms=0.0, flush=False)
    assert out["frames"] == [] and st["rest"].shape == (300,) and st["context"].shape == (64,)
    out = vad_windows(x[300:], session_state=st, ts_ms=300 / 16, flush=False)
    assert len(out["frames"]) == 1 and out["times"] == [[0, 0.0]]
    np.testing.assert_array_equal(out["frames"][0][0, 64:], x[:512])
    np.testing.assert_array_equal(st["rest"], x[512:])
    np.testing.assert_array_equal(st["context"], x[512 - 64 : 512])
    assert st["rest_ts"] == pytest.approx(512 / 16)
    with pytest.raises(InputError, match="vad: audio has shape \\[2, 3\\]"):
        vad_windows(np.zeros((2, 3), np.float32))
