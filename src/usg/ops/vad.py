"""Voice activity detection with silero-vad's ONNX model: frame probabilities, then speech segments.

:func:`speech_probabilities` runs the model over 512-sample chunks at 16 kHz (256 at 8 kHz),
each chunk preceded by the last 64 (32) samples of the one before, carrying the model's
``state`` ([2, 1, 128]) from chunk to chunk within one request. It is a Python op around an
ONNX Runtime session: chunks of different streams are not batched together.

:func:`speech_segments` turns the probabilities into segments with the rules of silero's
``get_speech_timestamps``: speech starts at a frame ``>= threshold``, ends after
``min_silence_ms`` below ``neg_threshold`` (default ``threshold - 0.15``), segments not longer
than ``min_speech_ms`` are dropped, and each is padded by ``speech_pad_ms`` (split in half
where two segments are closer than twice the padding).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.ops.signature import op
from usg.specs import TensorSpec

__all__ = ["DEFAULT_VAD_MODEL", "speech_probabilities", "speech_segments", "vad_window"]

DEFAULT_VAD_MODEL = "pkg://silero_vad/data/silero_vad.onnx"
_CONTEXT = {16_000: 64, 8_000: 32}


def vad_window(sample_rate: int) -> int:
    """Samples per VAD frame: 512 at 16 kHz, 256 at 8 kHz."""
    if sample_rate not in _CONTEXT:
        raise InputError(
            f"silero-vad runs at 8000 or 16000 Hz, not {sample_rate}",
            field="sample_rate",
            fix="declare sample_rate: 16000 on the audio input (it is resampled on decoding)",
        )
    return 512 if sample_rate == 16_000 else 256


@functools.lru_cache(maxsize=4)
def _session(path: str) -> tuple[Any, threading.Lock]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"]), threading.Lock()


def _model_path(model: str) -> str:
    from usg.paths import resolve_path

    return str(resolve_path(model, Path.cwd()))


@op(
    inputs={"audio": TensorSpec("float32", ("T",))},
    outputs={"probs": TensorSpec("float32", ("F",)), "num_samples": None},
)
def speech_probabilities(
    audio: np.ndarray, sample_rate: int = 16_000, model: str = DEFAULT_VAD_MODEL
) -> dict[str, Any]:
    """Mono samples → one speech probability per window (the last window zero-padded)."""
    window = vad_window(sample_rate)
    context = _CONTEXT[sample_rate]
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise InputError(f"vad: audio has shape {list(x.shape)}", field="audio", fix="pass mono audio (channels: 1)")
    n = x.shape[0]
    n_frames = -(-n // window)
    padded = np.zeros(context + n_frames * window, dtype=np.float32)
    padded[context : context + n] = x
    session, lock = _session(_model_path(model))
    state = np.zeros((2, 1, 128), dtype=np.float32)
    sr = np.array(sample_rate, dtype=np.int64)
    probs = np.empty(n_frames, dtype=np.float32)
    with lock:  # one session, its state carried chunk to chunk; requests take turns
        for i in range(n_frames):
            chunk = padded[i * window : i * window + context + window][None]
            out, state = session.run(None, {"input": chunk, "state": state, "sr": sr})
            probs[i] = out[0, 0]
    return {"probs": probs, "num_samples": int(n)}


def _raw_segments(probs: np.ndarray, window: int, threshold: float, neg: float, min_silence: float) -> list[list[int]]:
    """[start, end] sample pairs before the minimum-length filter and padding; an open end is -1."""
    out: list[list[int]] = []
    start: int | None = None
    silence_from = 0
    for i, p in enumerate(probs):
        at = i * window
        if p >= threshold:
            silence_from = 0
            if start is None:
                start = at
            continue
        if start is not None and p < neg:
            if not silence_from:
                silence_from = at
            if at - silence_from >= min_silence:
                out.append([start, silence_from])
                start, silence_from = None, 0
    if start is not None:
        out.append([start, -1])
    return out


def _pad(segments: list[list[int]], pad: float, total: int) -> None:
    for i, seg in enumerate(segments):
        if i == 0:
            seg[0] = int(max(0, seg[0] - pad))
        if i == len(segments) - 1:
            seg[1] = int(min(total, seg[1] + pad))
            continue
        nxt = segments[i + 1]
        gap = nxt[0] - seg[1]
        if gap < 2 * pad:
            seg[1] += int(gap // 2)
            nxt[0] = int(max(0, nxt[0] - gap // 2))
        else:
            seg[1] = int(min(total, seg[1] + pad))
            nxt[0] = int(max(0, nxt[0] - pad))


@op(inputs={"probs": TensorSpec("float32", ("F",)), "num_samples": None}, outputs={"segments": None})
def speech_segments(
    probs: np.ndarray,
    num_samples: int,
    sample_rate: int = 16_000,
    threshold: float = 0.5,
    neg_threshold: float | None = None,
    min_speech_ms: float = 250.0,
    min_silence_ms: float = 100.0,
    speech_pad_ms: float = 30.0,
) -> dict[str, list[dict[str, float]]]:
    """Frame probabilities → ``segments``: a list of ``{start_ms, end_ms}`` of speech."""
    window = vad_window(sample_rate)
    neg = max(threshold - 0.15, 0.01) if neg_threshold is None else neg_threshold
    min_speech = sample_rate * min_speech_ms / 1000
    raw = _raw_segments(np.asarray(probs), window, threshold, neg, sample_rate * min_silence_ms / 1000)
    kept = []
    for start, end in raw:
        end = num_samples if end < 0 else end
        if end - start > min_speech:
            kept.append([start, end])
    _pad(kept, sample_rate * speech_pad_ms / 1000, num_samples)
    ms = 1000.0 / sample_rate
    return {"segments": [{"start_ms": round(s * ms, 3), "end_ms": round(e * ms, 3)} for s, e in kept]}
