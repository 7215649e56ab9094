"""Audio ops on synthetic signals: framing, mel filters and log-mel vs transformers, VAD segments vs silero."""

from __future__ import annotations

import numpy as np
import pytest

from usg.errors import InputError
from usg.ops.audio import frame_audio, frames, log_mel, mel_filters
from usg.ops.vad import speech_segments, vad_window


def chirp(seconds: float = 1.3, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    x = 0.4 * np.sin(2 * np.pi * (100 + 1500 * t) * t) + 0.05 * rng.standard_normal(t.shape)
    return x.astype(np.float32)


def test_framing_is_25_ms_every_10_ms_by_default() -> None:
    x = np.arange(16_000, dtype=np.float32)
    out = frame_audio(x)["frames"]
    assert out.shape == (1 + (16_000 - 400) // 160, 400)
    np.testing.assert_array_equal(out[3], x[480:880])
    assert frame_audio(x, sample_rate=8_000, window_ms=32, hop_ms=16)["frames"].shape == (
        1 + (16_000 - 256) // 128,
        256,
    )
    assert frames(x[:100], 400, 160).shape == (0, 400)
    with pytest.raises(ValueError, match=r"1-D samples, got shape \[2, 3\]"):
        frames(np.zeros((2, 3), np.float32), 2, 1)


def test_mel_filters_equal_transformers_slaney_filters() -> None:
    audio_utils = pytest.importorskip("transformers.audio_utils", reason="needs transformers (usg[torch])")
    ref = audio_utils.mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=80,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=16_000,
        norm="slaney",
        mel_scale="slaney",
    )
    np.testing.assert_allclose(mel_filters(16_000, 400, 80), ref, rtol=1e-6, atol=1e-9)


def test_log_mel_equals_whisper_feature_extractor_on_a_chirp() -> None:
    tf = pytest.importorskip("transformers", reason="needs transformers (usg[torch])")
    x = chirp()
    ref = tf.WhisperFeatureExtractor()._np_extract_fbank_features(x[None].astype(np.float64), "cpu")[0]
    ours = log_mel(x)["features"]
    assert ours.shape == ref.shape == (80, x.shape[0] // 160)
    assert np.abs(ours - ref).max() < 1e-4


def test_log_mel_rejects_audio_shorter_than_half_a_window() -> None:
    with pytest.raises(InputError, match=r"shorter than half a window \(201 samples\)"):
        log_mel(np.zeros(100, np.float32))


def test_vad_window_and_rate_check() -> None:
    assert vad_window(16_000) == 512 and vad_window(8_000) == 256
    with pytest.raises(InputError, match=r"8000 or 16000 Hz, not 44100; fix: declare sample_rate: 16000"):
        vad_window(44_100)


def seg_ms(segments: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(s["start_ms"], s["end_ms"]) for s in segments]


def test_segments_follow_silero_rules_on_a_hand_made_sequence() -> None:
    # 32 ms frames: speech 10-19, a dip to 0.2 for 2 frames (64 ms < 100 ms min silence: bridged),
    # speech 22-29, silence; then 5 frames of speech (160 ms < 250 ms min speech: dropped)
    p = np.zeros(60, np.float32)
    p[10:20] = 0.9
    p[20:22] = 0.2
    p[22:30] = 0.9
    p[40:45] = 0.9
    out = speech_segments(p, num_samples=60 * 512)["segments"]
    # start 10*32 ms - 30 ms pad; the silence starts at frame 30 (960 ms) + 30 ms pad
    assert seg_ms(out) == [(290.0, 990.0)]
    # probabilities between neg_threshold (0.35) and threshold neither start nor end speech
    p2 = np.zeros(60, np.float32)
    p2[5:30] = 0.9
    p2[12:16] = 0.4
    assert seg_ms(speech_segments(p2, num_samples=60 * 512)["segments"]) == [(130.0, 990.0)]


def test_segments_equal_silero_get_speech_timestamps_from_probs_on_random_sequences() -> None:
    silero = pytest.importorskip("silero_vad.utils_vad", reason="needs silero-vad (usg[reference])")
    rng = np.random.default_rng(1)
    several = 0
    for trial in range(200):
        n = int(rng.integers(1, 400))
        # runs of speech / silence with noisy probabilities, so every rule is exercised
        levels = rng.choice([0.02, 0.3, 0.45, 0.6, 0.95], size=n // 8 + 1)
        p = np.clip(np.repeat(levels, 8)[:n] + rng.normal(0, 0.08, n), 0, 1).astype(np.float32)
        total = n * 512 - int(rng.integers(0, 512))
        kw = {"threshold": float(rng.choice([0.3, 0.5, 0.7])), "speech_pad_ms": int(rng.choice([0, 30, 200]))}
        kw_ms = {"min_speech_ms": int(rng.choice([0, 250])), "min_silence_ms": int(rng.choice([0, 100, 300]))}
        ref = silero.get_speech_timestamps_from_probs(
            [float(v) for v in p],
            sampling_rate=16_000,
            audio_length_samples=total,
            min_speech_duration_ms=kw_ms["min_speech_ms"],
            min_silence_duration_ms=kw_ms["min_silence_ms"],
            **kw,
        )
        ours = speech_segments(p, num_samples=total, **kw, **kw_ms)["segments"]
        expected = [(round(r["start"] / 16, 3), round(r["end"] / 16, 3)) for r in ref]
        assert seg_ms(ours) == expected, (trial, kw, kw_ms)
        several += len(expected) >= 2
    assert several > 50  # the sequences do produce several segments each, not only empty results
