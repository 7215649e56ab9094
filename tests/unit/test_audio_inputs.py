"""Audio inputs: decoding WAV/FLAC/OGG, channels, resampling, limits from the header, graph files, /v1 and usg run."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

sf = pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("soxr", reason="needs the audio extra: pip install -e '.[audio]'")

from usg.cli import main  # noqa: E402
from usg.errors import GraphError, InputError, PayloadTooLarge  # noqa: E402
from usg.graph import Graph, GraphBuilder, load_graph  # noqa: E402
from usg.ops.audio import decode_audio  # noqa: E402
from usg.runtime.inputs import normalize_inputs  # noqa: E402
from usg.specs import AudioSpec, Modality  # noqa: E402


def tone(seconds: float, rate: int, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return x if channels == 1 else np.stack([x * (c + 1) / channels for c in range(channels)], axis=1)


def encoded(x: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(("fmt", "subtype"), [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", None), ("OGG", "VORBIS")])
def test_decodes_each_container_to_float32_mono_at_the_input_rate(fmt: str, subtype: str | None) -> None:
    x = tone(0.5, 16_000)
    out = decode_audio(encoded(x, 16_000, fmt, subtype), spec=AudioSpec(sample_rate=16_000))
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.shape[0] - x.shape[0]) <= 1  # Vorbis may differ by a frame of padding
    if fmt != "OGG":  # lossless (PCM_16 quantizes to 1/32768)
        np.testing.assert_allclose(out[: x.shape[0]], x, atol=1e-4)


def test_resamples_with_soxr_and_keeps_the_tone() -> None:
    out = decode_audio(encoded(tone(1.0, 44_100, 1000.0), 44_100), spec=AudioSpec(sample_rate=16_000))
    assert out.shape == (16_000,)
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) == 1000  # 1 Hz bins over one second: the 1 kHz tone survives resampling


def test_stereo_is_mixed_to_mono_or_kept_when_declared(tmp_path: Path) -> None:
    x = tone(0.25, 16_000, channels=2)
    path = tmp_path / "st.wav"
    sf.write(path, x, 16_000, subtype="FLOAT")
    mono = decode_audio(path, spec=AudioSpec(channels=1))
    np.testing.assert_allclose(mono, x.mean(axis=1), atol=1e-6)
    assert decode_audio(path, spec=AudioSpec(channels=2)).shape == (4000, 2)
    with pytest.raises(InputError, match=r"has 2 channels, the input takes 3; fix: send 3-channel audio"):
        decode_audio(path, spec=AudioSpec(channels=3))


def test_bad_truncated_and_empty_audio_are_input_errors_naming_the_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"speech: 16 bytes is not decodable audio \(first bytes 6e6f7420617564"):
        decode_audio(b"not audio at all", field="speech")
    flac = encoded(tone(2.0, 16_000), 16_000, "FLAC")
    with pytest.raises(InputError, match=r"speech: .* (truncated|not decodable)"):
        decode_audio(flac[: len(flac) // 3], field="speech")
    with pytest.raises(InputError, match=r"speech: the audio is empty \(0 bytes\)"):
        decode_audio(b"", field="speech")
    with pytest.raises(InputError, match=r"speech: '.*nope.wav' does not exist"):
        decode_audio(tmp_path / "nope.wav", field="speech")
    with pytest.raises(InputError, match=r"speech: got int; fix: pass audio as a file path"):
        decode_audio(3, field="speech")
    with pytest.raises(InputError, match=r"NaN or infinite"):
        decode_audio(np.array([0.0, np.nan], np.float32), field="speech")
    with pytest.raises(InputError, match=r"not a non-empty float array"):
        decode_audio(np.zeros(10, np.int16), field="speech")


def test_truncated_wav_whose_header_promises_more_frames() -> None:
    wav = encoded(tone(1.0, 16_000), 16_000, "WAV", "PCM_16")
    cut = wav[: 44 + 2 * 8000]  # header + half the frames
    with pytest.raises(InputError, match=r"audio: .*truncated"):
        decode_audio(cut)


def test_too_long_is_413_from_the_header_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encoded(tone(3.0, 8_000), 8_000, "FLAC")

    def no_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded although the header already says the clip is too long")

    monkeypatch.setattr(sf, "read", no_read)
    with pytest.raises(
        PayloadTooLarge, match=r"speech: audio is 3.0 s long, above the input's limit of 2 s; fix: send"
    ):
        decode_audio(data, field="speech", spec=AudioSpec(max_seconds=2))
    assert PayloadTooLarge.status == 413
    with pytest.raises(PayloadTooLarge, match=r"audio is 3.0 s long"):
        decode_audio(np.zeros(48_000, np.float32), spec=AudioSpec(max_seconds=2))


GRAPH = """
name: a
inputs:
  speech: {modality: audio, sample_rate: 8000, channels: 1, max_seconds: 2}
nodes:
  fr: {fn: "usg.ops.audio:frame_audio", inputs: {audio: inputs.speech}, options: {sample_rate: 8000}}
outputs:
  frames: fr.frames
"""


def load_graph_text(text: str, tmp_path: Path) -> Graph:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return load_graph(path)


def test_graph_file_declares_audio_inputs_and_rejects_bad_values(tmp_path: Path) -> None:
    g = load_graph_text(GRAPH, tmp_path)
    d = g.inputs["speech"]
    assert d.modality is Modality.AUDIO and d.audio == AudioSpec(8000, 1, 2.0)
    bad = GRAPH.replace("sample_rate: 8000, channels: 1", "sample_rate: -5, channels: two")
    with pytest.raises(
        GraphError, match=r"(?s)inputs.speech.sample_rate: sample_rate is -5\n\s*fix: write a positive int"
    ):
        load_graph_text(bad, tmp_path)
    with pytest.raises(GraphError, match=r"inputs.speech.channels: channels is 'two'"):
        load_graph_text(bad, tmp_path)
    image_with_rate = GRAPH.replace("modality: audio", "modality: image")
    with pytest.raises(GraphError, match=r"inputs.speech.sample_rate: unknown key 'sample_rate'"):
        load_graph_text(image_with_rate, tmp_path)


def test_normalize_inputs_decodes_and_limits_audio_inputs() -> None:
    g = (
        GraphBuilder("b")
        .input("speech", "audio")
        .node("fr", fn="usg.ops.audio:frame_audio", inputs={"audio": "inputs.speech"})
        .output("frames", "fr.frames")
        .build()
    )
    assert g.inputs["speech"].audio == AudioSpec()
    out = normalize_inputs(g, {"speech": encoded(tone(0.1, 48_000), 48_000)})
    assert out["speech"].shape == (1600,)
    with pytest.raises(PayloadTooLarge, match="above the input's limit of 600 s"):
        normalize_inputs(g, {"speech": np.zeros(16_000 * 601, np.float32)})


def test_v1_json_base64_and_multipart_audio(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the serve extra")
    pytest.importorskip("httpx", reason="needs the serve extra")
    from starlette.testclient import TestClient

    from usg.serve import create_app

    wav = encoded(tone(0.05, 8_000), 8_000)  # 400 samples: 3 frames of 200 (25 ms) every 80 (10 ms)
    with TestClient(create_app(load_graph_text(GRAPH, tmp_path), backends={})) as c:
        r = c.post("/v1/infer", json={"inputs": {"speech": {"b64": base64.b64encode(wav).decode()}}})
        assert r.status_code == 200, r.text
        assert np.asarray(r.json()["outputs"]["frames"]).shape == (3, 200)
        r = c.post("/v1/infer", files={"speech": ("a.wav", wav, "audio/wav")})
        assert r.status_code == 200, r.text
        assert np.asarray(r.json()["outputs"]["frames"]).shape == (3, 200)
        r = c.post("/v1/infer", json={"inputs": {"speech": "@@not base64"}})
        assert r.status_code == 400 and "speech: audio is not valid base64" in r.json()["message"]
        r = c.post("/v1/infer", files={"speech": ("a.wav", b"RIFF....junk", "audio/wav")})
        assert r.status_code == 400 and "speech: 12 bytes is not decodable audio" in r.json()["message"]
        long = encoded(np.zeros(8_000 * 3, np.float32), 8_000)
        r = c.post("/v1/infer", files={"speech": ("a.wav", long, "audio/wav")})
        assert r.status_code == 413, r.text
        assert "above the input's limit of 2 s" in r.json()["message"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return int(exc.value.code or 0), out.out, out.err


def test_usg_run_takes_an_audio_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / "g.yaml"
    graph.write_text(GRAPH)
    sf.write(tmp_path / "a.wav", tone(0.05, 8_000), 8_000)
    code, out, _ = run_cli(["run", str(graph), "-i", f"speech={tmp_path / 'a.wav'}", "--json"], capsys)
    assert code == 0
    assert np.asarray(json.loads(out)["outputs"]["frames"]).shape == (3, 200)
    # the integrity digest is of the file's bytes, not of its path (the node cache keys on it too)
    assert (
        json.loads(out)["integrity"]["speech"]
        == "sha256:" + hashlib.sha256((tmp_path / "a.wav").read_bytes()).hexdigest()
    )
    (tmp_path / "bad.wav").write_bytes(b"RIFF0000WAVEjunk")
    code, _, err = run_cli(["run", str(graph), "-i", f"speech={tmp_path / 'bad.wav'}"], capsys)
    assert code != 0 and "speech: file" in err and "is not decodable audio" in err


def test_graph_dump_round_trips_the_audio_settings(tmp_path: Path) -> None:
    import yaml

    from usg.graph.dump import graph_to_mapping

    g = load_graph_text(GRAPH, tmp_path)
    again = load_graph_text(yaml.safe_dump(graph_to_mapping(g)), tmp_path)
    assert again.inputs["speech"] == g.inputs["speech"]
    assert again.inputs["speech"].audio == AudioSpec(8000, 1, 2.0)


def test_header_with_absurd_channel_count_is_refused_before_decoding() -> None:
    wav = bytearray(encoded(np.zeros((10, 2), np.float32), 8_000, "WAV", "PCM_16"))
    wav[22:24] = (200).to_bytes(2, "little")  # fmt chunk: channels
    with pytest.raises(InputError, match=r"audio: 84 bytes declares 8000 Hz, 200 channels; fix: send a WAV"):
        decode_audio(bytes(wav))


def test_missing_soundfile_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from usg.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(
        MissingDependency, match=r"decoding audio inputs needs .*'soundfile'.*pip install 'usg\[audio\]'"
    ):
        decode_audio(b"RIFF")


def test_node_cache_key_depends_on_the_rate_and_channels_decoding_yields(tmp_path: Path) -> None:
    from usg.cache.key import node_keys

    g16 = load_graph_text(GRAPH, tmp_path)
    g8 = load_graph_text(GRAPH.replace("sample_rate: 8000", "sample_rate: 16000"), tmp_path)
    st = load_graph_text(GRAPH.replace("channels: 1", "channels: 2"), tmp_path)
    same = load_graph_text(GRAPH.replace("max_seconds: 2", "max_seconds: 5"), tmp_path)
    keys = [node_keys(g, {"fr": "fn"}, {"speech": "abc"}, ["fr"])["fr"] for g in (g16, g8, st, same)]
    assert len(set(keys[:3])) == 3
    assert keys[3] == keys[0]  # the length limit does not change what a node computes


def test_openapi_describes_an_audio_input_as_base64(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the serve extra")
    from starlette.testclient import TestClient

    from usg.serve import create_app

    with TestClient(create_app(load_graph_text(GRAPH, tmp_path), backends={})) as c:
        text = json.dumps(c.get("/openapi.json").json())
    assert "base64 of a WAV/FLAC/OGG file" in text
