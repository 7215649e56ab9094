"""Real speech (espeak-ng) through the real silero-vad ONNX model: segments vs the known speech and vs silero itself."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

sf = pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("soxr", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("onnxruntime")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

from usg.cli import main  # noqa: E402
from usg.graph import load_graph  # noqa: E402
from usg.ops.audio import decode_audio, log_mel  # noqa: E402
from usg.ops.vad import speech_probabilities, speech_segments  # noqa: E402
from usg.runtime import Executor  # noqa: E402

RATE = 16_000
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "speech_segments" / "graph.yaml"
LEAD_MS, GAP_MS, TAIL_MS = 700, 1200, 600


@dataclass(frozen=True)
class Talk:
    path: Path
    samples: np.ndarray
    speech_ms: list[tuple[float, float]]  # first to last non-silent sample of each phrase


def _voiced(x: np.ndarray) -> tuple[int, int]:
    idx = np.nonzero(np.abs(x) > 1e-3)[0]
    return int(idx[0]), int(idx[-1])


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Talk:
    """Two espeak-ng phrases (22.05 kHz, resampled to 16 kHz by decode_audio) with 1.2 s of silence between."""
    d = tmp_path_factory.mktemp("speech")
    phrases = []
    for i, text in enumerate(["the quick brown fox jumps over the lazy dog", "seven hundred and forty two apples"]):
        wav = d / f"p{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", str(wav), text], check=True, capture_output=True)
        phrases.append(decode_audio(wav))
    silence = [np.zeros(RATE * ms // 1000, np.float32) for ms in (LEAD_MS, GAP_MS, TAIL_MS)]
    x = np.concatenate([silence[0], phrases[0], silence[1], phrases[1], silence[2]])
    speech_ms = []
    offset = silence[0].shape[0]
    for p, gap in zip(phrases, silence[1:], strict=True):
        a, b = _voiced(p)
        speech_ms.append(((offset + a) * 1000 / RATE, (offset + b) * 1000 / RATE))
        offset += p.shape[0] + gap.shape[0]
    path = d / "talk.wav"
    sf.write(path, x, RATE, subtype="FLOAT")
    return Talk(path, x, speech_ms)


def _silero_reference(x: np.ndarray) -> list[tuple[float, float]]:
    import silero_vad
    import torch

    model = silero_vad.load_silero_vad(onnx=True)
    ts = silero_vad.get_speech_timestamps(torch.from_numpy(x), model, sampling_rate=RATE)
    return [(t["start"] * 1000 / RATE, t["end"] * 1000 / RATE) for t in ts]


def _segments(out: dict[str, object]) -> list[tuple[float, float]]:
    segs = out["segments"]
    assert isinstance(segs, list)
    return [(s["start_ms"], s["end_ms"]) for s in segs]


def test_vad_segments_match_the_known_speech_positions(talk: Talk) -> None:
    probs = speech_probabilities(talk.samples)
    assert probs["probs"].shape == (-(-talk.samples.shape[0] // 512),)
    segs = _segments(speech_segments(probs["probs"], probs["num_samples"]))
    assert len(segs) == 2, segs
    for (start, end), (true_start, true_end) in zip(segs, talk.speech_ms, strict=True):
        # start: the first frame >= 0.5 lies within the first 32 ms frames of the voice, minus the 30 ms
        # pad; espeak's onsets are soft, so the model may trigger up to ~4 frames in: 30 + 4*32 < 160
        assert true_start - 100 <= start <= true_start + 160, (start, true_start)
        # end: speech ends at the first frame below 0.35 (<= 2 frames after the voice, trailing sibilants),
        # then min_silence (100 ms) is waited out and 30 ms padding added: at most ~64 + 30 + 100 ms late
        assert true_end - 150 <= end <= true_end + 250, (end, true_end)
    assert segs[0][1] < segs[1][0]  # the 1.2 s pause separates the phrases


def test_vad_segments_equal_silero_get_speech_timestamps(talk: Talk) -> None:
    ours = _segments(speech_segments(**speech_probabilities(talk.samples)))
    ref = _silero_reference(talk.samples)
    assert len(ours) == len(ref) == 2
    frame_ms = 512 * 1000 / RATE
    for (s, e), (rs, re) in zip(ours, ref, strict=True):
        assert abs(s - rs) <= frame_ms and abs(e - re) <= frame_ms, (ours, ref)


@pytest.mark.parametrize("rate", [16_000, 8_000])
def test_probabilities_equal_silero_onnx_wrapper_chunk_by_chunk(talk: Talk, rate: int) -> None:
    import silero_vad
    import soxr
    import torch

    model = silero_vad.load_silero_vad(onnx=True)
    x = talk.samples if rate == RATE else soxr.resample(talk.samples, RATE, rate).astype(np.float32)
    window = 512 if rate == 16_000 else 256
    x = x[: window * 80 + 100]  # a partial last chunk, zero-padded by both
    chunks = [x[i : i + window] for i in range(0, x.shape[0], window)]
    chunks[-1] = np.pad(chunks[-1], (0, window - chunks[-1].shape[0]))
    ref = [model(torch.from_numpy(c), rate).item() for c in chunks]
    ours = speech_probabilities(x, sample_rate=rate)["probs"]
    assert max(ref) > 0.5  # the excerpt holds speech
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_log_mel_equals_whisper_on_real_speech(talk: Talk) -> None:
    tf = pytest.importorskip("transformers", reason="needs transformers (usg[torch])")
    x = talk.samples
    ref = tf.WhisperFeatureExtractor()._np_extract_fbank_features(x[None].astype(np.float64), "cpu")[0]
    ours = log_mel(x)["features"]
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-4


def test_example_graph_through_the_executor_and_usg_run(talk: Talk, capsys: pytest.CaptureFixture[str]) -> None:
    graph = load_graph(EXAMPLE)
    with Executor(graph) as ex:
        direct = ex.infer_sync({"audio": talk.path.read_bytes()}).to_json_dict()["outputs"]
    with pytest.raises(SystemExit) as exc:
        main(["run", str(EXAMPLE), "-i", f"audio={talk.path}", "--json"])
        raise SystemExit(0)
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)["outputs"]
    assert out == direct
    assert _segments(out) == _segments(speech_segments(**speech_probabilities(talk.samples)))
