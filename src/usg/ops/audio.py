"""Audio decoding with limits (soundfile, PyAV + soxr, extra ``usg[audio]``), framing and log-mel features.

:func:`decode_audio` reads WAV / FLAC / OGG (libsndfile) or MP3 / AAC / M4A / WebM (FFmpeg through
PyAV, :mod:`usg.ops.audio_av`) from a path, bytes or an array, checks the length from the header
before decoding, mixes or checks channels and resamples to the input's rate. :func:`log_mel`
computes Whisper-style log-mel features (Hann window, power STFT, Slaney mel filters, log10,
8 dB dynamic range, ``(x + 4) / 4``).
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, MissingDependency, PayloadTooLarge
from usg.ops.audio_av import AV_FORMATS, decode_av, sniff_container
from usg.ops.files import read_input_file
from usg.ops.signature import op
from usg.specs import AudioSpec, TensorSpec

__all__ = ["all_finite", "decode_audio", "frame_audio", "frames", "log_mel", "mel_filters"]


def _soundfile() -> Any:
    try:
        import soundfile
    except ImportError as exc:
        raise MissingDependency("soundfile", "audio", "decoding audio inputs") from exc
    return soundfile


def _soxr() -> Any:
    try:
        import soxr
    except ImportError as exc:
        raise MissingDependency("soxr", "audio", "resampling audio inputs") from exc
    return soxr


def decode_audio(value: Any, *, field: str = "audio", spec: AudioSpec | None = None) -> np.ndarray:
    """A path, encoded bytes or a float array → float32 samples at ``spec.sample_rate``.

    Mono (``channels: 1``) gives shape ``[samples]`` (channels are averaged); more channels give
    ``[samples, channels]``. The length limit is checked from the header before any decoding.
    An array is taken as already at ``spec.sample_rate``.
    """
    spec = spec or AudioSpec()
    if isinstance(value, np.ndarray):
        return _from_array(value, field, spec, spec.sample_rate, None)
    if isinstance(value, (str, Path)):
        path = Path(value)
        if path.is_dir() or not path.exists():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise InputError(f"{field}: {str(path)!r} {what}", field=field, fix="pass the path of an audio file")
        data, label = read_input_file(path, field), f"file {str(path)!r}"  # /dev/stdin works; /dev/zero is bounded
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        label = f"{len(data)} bytes"
    else:
        raise InputError(
            f"{field}: got {type(value).__name__}",
            field=field,
            fix="pass audio as a file path, encoded bytes (WAV/FLAC/OGG/MP3/M4A/...) or a float32 array of samples",
        )
    if not data:
        raise InputError(
            f"{field}: {'the audio' if label.endswith(' bytes') else label} is empty (0 bytes)",
            field=field,
            fix="send the audio file's bytes",
        )
    samples, rate = _decode_bytes(data, field, label, spec)
    return _from_array(samples, field, spec, rate, label)


def _decode_bytes(data: bytes, field: str, label: str, spec: AudioSpec) -> tuple[np.ndarray, int]:
    """WAV / FLAC / OGG / AIFF with libsndfile; MP3 / AAC / M4A / WebM ... with FFmpeg (:mod:`usg.ops.audio_av`)."""
    kind = sniff_container(data)
    if kind not in ("sndfile", "unknown"):
        return decode_av(data, field, label, spec, kind)
    sf = _soundfile()
    fix = f"send a WAV, FLAC, OGG, {AV_FORMATS} file (re-encode it, e.g. ffmpeg -i IN -ar 16000 OUT.wav)"
    try:
        info = sf.info(io.BytesIO(data))
    except Exception:  # libsndfile rejects anything it cannot parse; the input's fault
        raise InputError(
            f"{field}: {label} is not decodable audio (first bytes {data[:8].hex()})", field=field, fix=fix
        ) from None
    if not (0 < info.samplerate <= _MAX_RATE and 0 < info.channels <= _MAX_CHANNELS):  # bounds the decode buffer
        raise InputError(
            f"{field}: {label} declares {info.samplerate} Hz, {info.channels} channels", field=field, fix=fix
        )
    _check_seconds(field, info.frames / info.samplerate, spec)
    short = _truncated_data_chunk(str(getattr(info, "extra_info", "")))
    if short is not None:
        raise InputError(
            f"{field}: {label} is truncated: its header declares {short[0]} bytes of audio data, "
            f"the file holds {short[1]}",
            field=field,
            fix="re-encode or re-upload the complete file",
        )
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # truncated or corrupt frames surface as LibsndfileError, RuntimeError ...
        raise InputError(f"{field}: {label} is truncated or corrupt audio ({exc})", field=field, fix=fix) from None
    if samples.shape[0] < info.frames:
        raise InputError(
            f"{field}: {label} is truncated: the header declares {info.frames} frames, {samples.shape[0]} decoded",
            field=field,
            fix="re-encode or re-upload the complete file",
        )
    return samples, int(rate)


_MAX_RATE = 768_000
_MAX_CHANNELS = 64
_SHOULD_BE = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_STREAMED = (0, 0xFFFFFFFF, 0x7FFFFFFF, 0x7FFFF000)  # size placeholders of WAVs written as a stream


def _truncated_data_chunk(extra_info: str) -> tuple[int, int] | None:
    """(declared, present) bytes when libsndfile reports a WAV data chunk longer than the file holds."""
    m = _SHOULD_BE.search(extra_info)
    if m is None:
        return None
    declared, present = int(m.group(1)), int(m.group(2))
    return (declared, present) if declared > present and declared not in _STREAMED else None


def _check_seconds(field: str, seconds: float, spec: AudioSpec) -> None:
    if seconds > spec.max_seconds:
        raise PayloadTooLarge(
            f"{field}: audio is {seconds:.1f} s long, above the input's limit of {spec.max_seconds:g} s",
            field=field,
            fix="send a shorter clip (split the recording), or raise max_seconds on the input in the graph",
        )


def _described(arr: np.ndarray) -> str:
    return f"array {arr.dtype}{list(arr.shape)}"


def all_finite(arr: np.ndarray) -> bool:
    """No NaN or infinity in float samples. The sum of squares (one BLAS dot product) is finite
    when every sample is; only when it is not (a NaN, an infinity, or samples so large that their
    squares overflow) are the samples checked one by one. The dot product keeps the GIL, which a
    numpy reduction over more than a few hundred values lets go of — on an event loop that shares
    the GIL with the model threads, getting it back costs more than the check."""
    flat = arr.reshape(-1)
    return math.isfinite(flat.dot(flat)) or bool(np.isfinite(flat).all())


def _from_array(arr: np.ndarray, field: str, spec: AudioSpec, rate: int, label: str | None) -> np.ndarray:
    """``label``: what the samples came from (None: an array passed as is, named by its dtype and shape)."""
    if arr.ndim == 1 and arr.dtype == np.float32 and arr.shape[0] and spec.channels == 1 and rate == spec.sample_rate:
        # mono float32 at the input's rate (a streaming chunk): only the checks, no copies
        _check_seconds(field, arr.shape[0] / rate, spec)
        if not all_finite(arr):
            what = label or _described(arr)
            raise InputError(f"{field}: {what} has NaN or infinite samples", field=field, fix="send finite samples")
        return np.ascontiguousarray(arr)
    label = label or _described(arr)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.floating):
        raise InputError(
            f"{field}: {label} is not a non-empty float array of [samples] or [samples, channels]",
            field=field,
            fix="pass float32 samples in [-1, 1], shape [samples] or [samples, channels]",
        )
    _check_seconds(field, arr.shape[0] / rate, spec)
    if not np.isfinite(arr).all():
        raise InputError(f"{field}: {label} has NaN or infinite samples", field=field, fix="send finite samples")
    if spec.channels == 1:
        arr = arr.mean(axis=1, keepdims=True)
    elif arr.shape[1] != spec.channels:
        raise InputError(
            f"{field}: {label} has {arr.shape[1]} channels, the input takes {spec.channels}",
            field=field,
            fix=f"send {spec.channels}-channel audio, or declare channels: 1 to mix it down",
        )
    arr = arr.astype(np.float32, copy=False)
    if rate != spec.sample_rate:
        arr = _soxr().resample(arr, rate, spec.sample_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(arr[:, 0] if spec.channels == 1 else arr)


def frames(samples: np.ndarray, window: int, hop: int) -> np.ndarray:
    """``[n_frames, window]`` views of 1-D ``samples`` every ``hop`` samples (no padding; [0, window] if short)."""
    if samples.ndim != 1:
        raise ValueError(f"frames() takes 1-D samples, got shape {list(samples.shape)}")
    if samples.shape[0] < window:
        return np.zeros((0, window), dtype=samples.dtype)
    return np.lib.stride_tricks.sliding_window_view(samples, window)[::hop]


@op(
    inputs={"audio": TensorSpec("float32", ("T",))},
    outputs={"frames": TensorSpec("float32", ("N", "W"))},
)
def frame_audio(
    audio: np.ndarray, sample_rate: int = 16_000, window_ms: float = 25.0, hop_ms: float = 10.0
) -> dict[str, np.ndarray]:
    """Mono samples → overlapping frames of ``window_ms`` every ``hop_ms`` (25 ms / 10 ms by default)."""
    window = round(sample_rate * window_ms / 1000)
    hop = round(sample_rate * hop_ms / 1000)
    return {"frames": np.ascontiguousarray(frames(np.asarray(audio, dtype=np.float32), window, hop))}


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    lin = hz * 3.0 / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz >= 1000.0, log, lin)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), mel * 200.0 / 3.0)


def mel_filters(
    sample_rate: int, n_fft: int, n_mels: int, f_min: float = 0.0, f_max: float | None = None
) -> np.ndarray:
    """``[n_fft // 2 + 1, n_mels]`` triangular Slaney-normalised mel filters (area-normalised by band width)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(f_min)), _hz_to_mel(np.array(f_max)), n_mels + 2))
    lo, mid, hi = edges[:-2], edges[1:-1], edges[2:]
    rising = (fft_hz[:, None] - lo) / (mid - lo)
    falling = (hi - fft_hz[:, None]) / (hi - mid)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return tri * (2.0 / (hi - lo))


@op(
    inputs={"audio": TensorSpec("float32", ("T",))},
    outputs={"features": TensorSpec("float32", ("M", "N"))},
)
def log_mel(
    audio: np.ndarray,
    sample_rate: int = 16_000,
    window_ms: float = 25.0,
    hop_ms: float = 10.0,
    n_mels: int = 80,
) -> dict[str, np.ndarray]:
    """Mono samples → ``[n_mels, n_frames]`` Whisper-style log-mel features.

    Frames are centred (the signal is reflect-padded by half a window), windowed with a periodic
    Hann window of ``window_ms`` (n_fft = window), every ``hop_ms``; the last frame is dropped as
    Whisper does. Values are ``log10`` power, floored at 8 below the maximum, scaled ``(x + 4) / 4``.
    """
    n_fft = round(sample_rate * window_ms / 1000)
    hop = round(sample_rate * hop_ms / 1000)
    x = np.asarray(audio, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] <= n_fft // 2:
        raise InputError(
            f"log_mel: audio of shape {list(x.shape)} is shorter than half a window ({n_fft // 2 + 1} samples)",
            field="audio",
            fix="pass mono audio of at least one window",
        )
    padded = np.pad(x, n_fft // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spec = np.abs(np.fft.rfft(frames(padded, n_fft, hop) * window, n=n_fft, axis=1)) ** 2
    mel = spec[:-1] @ mel_filters(sample_rate, n_fft, n_mels)
    logm = np.log10(np.maximum(mel, 1e-10))
    logm = np.maximum(logm, logm.max() - 8.0)
    return {"features": np.ascontiguousarray(((logm + 4.0) / 4.0).T.astype(np.float32))}
