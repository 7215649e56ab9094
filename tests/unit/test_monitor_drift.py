"""Drift detectors on synthetic shifts with known answers, and the false-alarm rate without shift."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("scipy")

from usg.graph.model import Ref
from usg.monitor.config import OutputWatch, Thresholds
from usg.monitor.drift import compare_profiles, psi
from usg.monitor.features import image_features, sniff_format, text_features
from usg.monitor.sketch import Observation, summarize

WORDS = ["alpha", "beta", "gamma", "delta", "total", "due", "invoice", "amount", "paid", "date", "order"]
INPUTS = {"image": "image", "text": "text"}
EMB = OutputWatch("emb", Ref("embed", "embedding"), "embedding")
WINDOW = 100


def _image(rng: np.random.Generator, gain: float = 1.0) -> np.ndarray[Any, Any]:
    base = rng.normal(110, 12)
    img = rng.normal(base, 25, size=(48, 64, 3)) * gain
    return np.clip(img, 0, 255).astype(np.uint8)


def _text(rng: np.random.Generator, times: int = 1) -> str:
    words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))
    return " ".join([words] * times)


def _embedding(rng: np.random.Generator, mean: np.ndarray[Any, Any], rot: Any = None) -> np.ndarray[Any, Any]:
    v = mean + rng.normal(0, 0.3, size=mean.shape)
    v = v / np.linalg.norm(v)
    return (v if rot is None else rot @ v).reshape(1, -1).astype(np.float32)


def _window(rng: np.random.Generator, n: int, *, gain: float = 1.0, times: int = 1, rot: Any = None) -> dict[str, Any]:
    mean = np.linspace(-1, 1, 16)
    obs = [
        Observation(
            float(i),
            {"image": image_features(_image(rng, gain), "png"), "text": text_features(_text(rng, times))},
            {"emb": _embedding(rng, mean, rot)},
        )
        for i in range(n)
    ]
    return summarize(obs, INPUTS, [EMB])


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _window(np.random.default_rng(12345), 1000)


def test_brightness_up_30_percent_is_flagged_in_one_window(reference: dict[str, Any]) -> None:
    result = compare_profiles(reference, _window(np.random.default_rng(1), WINDOW, gain=1.3), Thresholds())
    assert result["drift"]
    assert "image.brightness" in result["drifted"]
    assert not any(d.startswith("text.") for d in result["drifted"])
    bright = next(t for t in result["features"] if t["feature"] == "brightness")
    assert bright["window_mean"] > 1.2 * bright["reference_mean"]


def test_text_twice_as_long_is_flagged_in_one_window(reference: dict[str, Any]) -> None:
    result = compare_profiles(reference, _window(np.random.default_rng(2), WINDOW, times=2), Thresholds())
    assert {"text.characters", "text.tokens"} <= set(result["drifted"])
    assert not any(d.startswith("image.") for d in result["drifted"])


def test_rotated_embeddings_are_flagged_in_one_window(reference: dict[str, Any]) -> None:
    from scipy.stats import special_ortho_group

    rot = special_ortho_group.rvs(16, random_state=7)
    result = compare_profiles(reference, _window(np.random.default_rng(3), WINDOW, rot=rot), Thresholds())
    assert result["drifted"] == ["emb"]
    emb = result["outputs"][0]
    assert emb["mmd_p_value"] < emb["alpha"]
    assert emb["centroid_cosine_shift"] > 0.1 and emb["centroid_warning"]


@pytest.mark.slow
def test_no_shift_false_alarm_rate_at_most_5_percent_over_100_windows(reference: dict[str, Any]) -> None:
    rng = np.random.default_rng(99)
    alarms = [compare_profiles(reference, _window(rng, WINDOW), Thresholds()) for _ in range(100)]
    rate = sum(r["drift"] for r in alarms) / len(alarms)
    print(f"false-alarm rate over 100 windows without shift: {rate:.2%}")
    assert rate <= 0.05, [r["drifted"] for r in alarms if r["drift"]]


def test_psi_grows_with_the_shift() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=2000)
    assert psi(ref, rng.normal(size=500)) < psi(ref, rng.normal(0.5, 1, size=500)) < psi(ref, rng.normal(1, 1, 500))


def test_image_format_shift_uses_chi_square(reference: dict[str, Any]) -> None:
    rng = np.random.default_rng(5)
    obs = [Observation(0.0, {"image": image_features(_image(rng), "jpeg")}) for _ in range(WINDOW)]
    result = compare_profiles(reference, summarize(obs, INPUTS, []), Thresholds())
    fmt = next(t for t in result["features"] if t["feature"] == "format")
    assert fmt["test"] == "chi2" and fmt["drift"]


def test_features_of_each_modality() -> None:
    img = np.zeros((30, 60, 3), dtype=np.uint8)
    img[..., :] = 200
    f = image_features(img, sniff_format(b"\x89PNG\r\n"))
    assert (f["width"], f["height"], f["aspect"], f["channels"], f["format"]) == (60.0, 30.0, 2.0, 3.0, "png")
    assert f["brightness"] == pytest.approx(200, abs=0.5) and f["contrast"] == pytest.approx(0, abs=1e-3)
    t = text_features("Hello мир 世界 42")
    assert t["characters"] == 15 and t["tokens"] == 4
    assert t["script_latin"] == pytest.approx(5 / 10) and t["script_cyrillic"] == pytest.approx(3 / 10)
    assert t["script_cjk"] == pytest.approx(2 / 10)
    from usg.monitor.features import audio_features

    a = audio_features(np.full(16000, 0.5, dtype=np.float32), 16000)
    assert a == {"samples": 16000.0, "rms": pytest.approx(0.5), "sample_rate": 16000.0, "seconds": 1.0}
