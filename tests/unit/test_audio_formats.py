"""Compressed audio through PyAV: MP3 / AAC / M4A / WebM-Opus decode, limits before and during decoding, bad files."""

from __future__ import annotations

import builtins
import io
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")

from media import AV_CODECS, encode_av  # noqa: E402

from usg.errors import InputError, MissingDependency, PayloadTooLarge  # noqa: E402
from usg.ops.audio import decode_audio  # noqa: E402
from usg.ops.audio_av import sniff_container  # noqa: E402
from usg.specs import AudioSpec  # noqa: E402

RATE = 16_000


def tone(seconds: float, freq: float = 1000.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", sorted(AV_CODECS))
def test_each_format_decodes_to_mono_float32_at_the_input_rate_and_keeps_the_tone(fmt: str) -> None:
    data = encode_av(tone(1.0), fmt)
    out = decode_audio(data, spec=AudioSpec(sample_rate=RATE))
    assert out.dtype == np.float32 and out.ndim == 1
    # encoders add priming / padding of a few frames (AAC: 1024 samples, Opus: 312 at 48 kHz)
    assert abs(out.shape[0] - RATE) <= 2048, out.shape
    spectrum = np.abs(np.fft.rfft(out[:RATE] if out.shape[0] >= RATE else np.pad(out, (0, RATE - out.shape[0]))))
    assert abs(int(np.argmax(spectrum)) - 1000) <= 2  # 1 Hz bins: the 1 kHz tone survives the lossy codec


def test_sniffing_sends_sndfile_containers_to_soundfile_and_the_rest_to_ffmpeg() -> None:
    assert sniff_container(encode_av(tone(0.2), "mp3")) == "mp3"  # an ID3 tag first
    assert sniff_container(encode_av(tone(0.2), "mp3")[10:]) == "unknown"  # inside the tag
    assert sniff_container(b"\xff\xfb\x90\x00") == "mp3"  # an MPEG-1 layer III frame header
    assert sniff_container(encode_av(tone(0.2), "adts")) == "aac"
    assert sniff_container(encode_av(tone(0.2), "ipod")) == "mov"
    assert sniff_container(encode_av(tone(0.2), "webm")) == "matroska"
    assert sniff_container(encode_av(tone(0.2), "ogg")) == "sndfile"  # libsndfile reads Ogg Opus
    assert sniff_container(b"RIFF\x00\x00\x00\x00WAVEfmt ") == "sndfile"
    assert sniff_container(b"not audio") == "unknown"


@pytest.mark.parametrize("fmt", ["mp3", "ipod", "webm", "adts"])
def test_too_long_is_a_413_from_the_declared_duration(fmt: str) -> None:
    data = encode_av(tone(3.0), fmt)
    with pytest.raises(
        PayloadTooLarge,
        match=r"speech: the container declares 3\.\d s of audio, above the input's limit of 2 s; fix: send a shorter",
    ):
        decode_audio(data, field="speech", spec=AudioSpec(max_seconds=2.0))


def test_a_stream_without_a_declared_duration_stops_decoding_past_max_seconds() -> None:
    data = encode_av(tone(3.0), "webm", seekable=False)  # a live WebM: no duration in its header
    with av.open(io.BytesIO(data)) as c:
        assert c.duration is None and c.streams.audio[0].duration is None
    with pytest.raises(
        PayloadTooLarge,
        match=r"speech: decoding stopped at 2\.\d+ s of audio \(more to come\), above the input's limit of 2 s",
    ):
        decode_audio(data, field="speech", spec=AudioSpec(max_seconds=2.0))
    assert abs(decode_audio(data, field="speech").shape[0] - 3 * RATE) <= 2048


@pytest.mark.parametrize("fmt", ["mp3", "ipod", "webm", "adts"])
def test_truncated_files_are_a_400_naming_the_input(fmt: str) -> None:
    data = encode_av(tone(2.0), fmt)
    with pytest.raises(InputError, match=r"speech: \d+ bytes is (truncated|not decodable)") as info:
        decode_audio(data[: len(data) // 2], field="speech")
    assert info.value.status == 400 and info.value.field == "speech"


def test_a_playlist_is_never_handed_to_ffmpeg_to_guess() -> None:
    playlist = b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n"  # an HLS playlist: FFmpeg probing could open its URL
    with pytest.raises(InputError, match=r"speech: \d+ bytes is not decodable audio \(first bytes 234558544d33550a\)"):
        decode_audio(playlist, field="speech")


def test_garbage_after_an_mp3_sync_word_is_a_400() -> None:
    with pytest.raises(InputError, match=r"speech: 4002 bytes is (not decodable|truncated or corrupt) audio"):
        decode_audio(b"\xff\xfb" + bytes(range(256)) * 15 + b"\x00" * 160, field="speech")


def test_without_pyav_compressed_audio_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode_av(tone(0.5), "mp3")
    real_import = builtins.__import__

    def no_av(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "av":
            raise ImportError("No module named 'av'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_av)
    with pytest.raises(
        MissingDependency,
        match=r"decoding compressed audio .* needs the Python package 'av'.*pip install 'usg\[audio\]'",
    ):
        decode_audio(data)
