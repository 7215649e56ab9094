"""Compressed audio (MP3 / AAC / M4A / Opus in WebM or Matroska ...) decoded with PyAV (FFmpeg), with limits.

:func:`sniff_container` tells the containers libsndfile reads (WAV, FLAC, OGG, AIFF) from those
that go to FFmpeg. :func:`decode_av` checks the duration the container declares against
``max_seconds`` before decoding anything (a 413), then decodes with a bound: it stops as soon as
the decoded length passes ``max_seconds`` (containers that declare no duration, or declare a
wrong one), and reports a file that decodes to clearly less than it declares as truncated.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from usg.errors import InputError, MissingDependency, PayloadTooLarge
from usg.specs import AudioSpec

__all__ = ["AV_FORMATS", "decode_av", "sniff_container"]

AV_FORMATS = "MP3, AAC, M4A or WebM/Opus"
_MAX_RATE = 768_000
_MAX_CHANNELS = 64
# a file is truncated when it decodes to less than it declares by more than this (encoder priming
# and padding make declared and decoded lengths differ by a few frames)
_TRUNCATED_SLACK_S = 0.25
_TRUNCATED_SLACK_SHARE = 0.02


def _av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise MissingDependency("av", "audio", f"decoding compressed audio ({AV_FORMATS})") from exc
    return av


def sniff_container(data: bytes) -> str:
    """``"sndfile"`` for WAV / FLAC / OGG / AIFF magic; the FFmpeg demuxer for MP3 (``mp3``), ADTS AAC
    (``aac``), MP4 / M4A (``mov``) and WebM / Matroska (``matroska``); ``"unknown"`` otherwise.
    Only the first bytes are read; FFmpeg is never left to guess (its probing also knows playlist
    formats that open other files and URLs)."""
    head = data[:12]
    if head[:4] in (b"RIFF", b"RIFX", b"RF64", b"fLaC", b"OggS") or (head[:4] == b"FORM" and head[8:11] == b"AIF"):
        return "sndfile"
    if head[:3] == b"ID3":
        return "mp3"
    if head[4:8] == b"ftyp":
        return "mov"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # a frame sync word
        return "aac" if head[1] & 0x06 == 0 else "mp3"  # layer bits 00: ADTS; else MPEG audio layer I-III
    return "unknown"


def _declared_seconds(container: Any, stream: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / 1e6  # av.time_base: microseconds
    return None


def _too_long(field: str, what: str, spec: AudioSpec) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{field}: {what}, above the input's limit of {spec.max_seconds:g} s",
        field=field,
        fix="send a shorter clip (split the recording), or raise max_seconds on the input in the graph",
    )


def decode_av(data: bytes, field: str, label: str, spec: AudioSpec, demuxer: str) -> tuple[np.ndarray, int]:
    """Encoded bytes → (float32 ``[samples, channels]``, sample rate) through FFmpeg's ``demuxer``
    (from :func:`sniff_container`), within ``spec.max_seconds``."""
    av = _av()
    fix = f"send a WAV, FLAC, OGG, {AV_FORMATS} file (re-encode it, e.g. ffmpeg -i IN -ar 16000 OUT.wav)"
    try:
        container = av.open(io.BytesIO(data), mode="r", format=demuxer, metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError):
        raise InputError(
            f"{field}: {label} is not decodable audio (first bytes {data[:8].hex()})", field=field, fix=fix
        ) from None
    with container:
        if not container.streams.audio:
            raise InputError(f"{field}: {label} holds no audio stream", field=field, fix=fix)
        stream = container.streams.audio[0]
        rate, channels = int(stream.codec_context.sample_rate or 0), int(stream.codec_context.channels or 0)
        if not (0 < rate <= _MAX_RATE and 0 < channels <= _MAX_CHANNELS):  # bounds the decode buffer
            raise InputError(f"{field}: {label} declares {rate} Hz, {channels} channels", field=field, fix=fix)
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > spec.max_seconds:
            raise _too_long(field, f"the container declares {declared:.1f} s of audio", spec)
        chunks = _decode_bounded(av, container, stream, rate, field, label, spec, fix)
    samples = np.concatenate(chunks, axis=1).T if chunks else np.zeros((0, channels), np.float32)
    decoded = samples.shape[0] / rate
    if declared is not None and decoded < declared - max(_TRUNCATED_SLACK_S, _TRUNCATED_SLACK_SHARE * declared):
        raise InputError(
            f"{field}: {label} is truncated: the container declares {declared:.2f} s, {decoded:.2f} s decoded",
            field=field,
            fix="re-encode or re-upload the complete file",
        )
    return np.ascontiguousarray(samples), rate


def _decode_bounded(
    av: Any, container: Any, stream: Any, rate: int, field: str, label: str, spec: AudioSpec, fix: str
) -> list[np.ndarray]:
    """Planar float32 ``[channels, n]`` chunks at ``rate``; a 413 as soon as they pass ``max_seconds``."""
    resampler = av.AudioResampler(format="fltp", layout=stream.codec_context.layout, rate=rate)
    limit = int(spec.max_seconds * rate)
    chunks: list[np.ndarray] = []
    total = 0
    try:
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunk = out.to_ndarray().astype(np.float32, copy=False)
                total += chunk.shape[1]
                if total > limit:  # the declared duration was absent or wrong: stop here
                    raise _too_long(field, f"decoding stopped at {total / rate:.2f} s of audio (more to come)", spec)
                chunks.append(chunk)
        chunks.extend(out.to_ndarray().astype(np.float32, copy=False) for out in resampler.resample(None))
    except (av.FFmpegError, ValueError) as exc:
        raise InputError(f"{field}: {label} is truncated or corrupt audio ({exc})", field=field, fix=fix) from None
    return chunks
