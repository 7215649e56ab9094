"""Per-modality statistics of one input value (cheap: a strided subsample for images).

image: width, height, aspect, brightness (mean luma 0–255), contrast (luma std), channels, format;
text: characters, tokens (words), script mix (share of letters per script); audio: samples, RMS
(and sample rate / seconds when known); tensor: size, mean, std.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from usg.specs import Modality

__all__ = ["CATEGORICAL", "audio_features", "image_features", "input_features", "sniff_format", "text_features"]

CATEGORICAL = frozenset({"format"})
_WORDS = re.compile(r"\w+", re.UNICODE)
_MAX_SCRIPT_CHARS = 4096
_SCRIPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("latin", ((0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x1E00, 0x1EFF))),
    ("cyrillic", ((0x400, 0x52F),)),
    ("greek", ((0x370, 0x3FF),)),
    ("arabic", ((0x600, 0x6FF), (0x750, 0x77F))),
    ("cjk", ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF))),
)
_MAGIC = (
    (b"\x89PNG", "png"),
    (b"\xff\xd8", "jpeg"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)


def sniff_format(data: bytes) -> str:
    """Image container from the first bytes (``unknown`` when not recognised)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return "unknown"


def image_features(image: np.ndarray[Any, Any], fmt: str | None = None) -> dict[str, Any]:
    """HWC (or HW) image → size, aspect, brightness and contrast of a ≤ ~64k-pixel strided subsample."""
    h, w = int(image.shape[0]), int(image.shape[1])
    channels = 1 if image.ndim == 2 else int(image.shape[2])
    stride = max(1, int(np.sqrt(h * w / 65536)))
    sub = image[::stride, ::stride]
    if channels >= 3:
        s = sub[..., :3].astype(np.float32)
        luma = 0.299 * s[..., 0] + 0.587 * s[..., 1] + 0.114 * s[..., 2]
    else:
        luma = sub.reshape(sub.shape[0], sub.shape[1]).astype(np.float32)
    if image.dtype != np.uint8 and float(luma.max(initial=0.0)) <= 1.0:
        luma = luma * 255.0  # float images in [0, 1]
    out: dict[str, Any] = {
        "width": float(w),
        "height": float(h),
        "aspect": w / h if h else 0.0,
        "brightness": float(luma.mean()) if luma.size else 0.0,
        "contrast": float(luma.std()) if luma.size else 0.0,
        "channels": float(channels),
    }
    if fmt is not None:
        out["format"] = fmt
    return out


def _script_of(code: int) -> str | None:
    for name, ranges in _SCRIPTS:
        for lo, hi in ranges:
            if lo <= code <= hi:
                return name
    return None


def text_features(text: str) -> dict[str, Any]:
    """Characters, word tokens, and the share of letters in each script (latin, cyrillic, … other)."""
    counts = dict.fromkeys([n for n, _ in _SCRIPTS] + ["other"], 0)
    letters = 0
    for ch in text[:_MAX_SCRIPT_CHARS]:
        if not ch.isalpha():
            continue
        letters += 1
        counts[_script_of(ord(ch)) or "other"] += 1
    out: dict[str, Any] = {"characters": float(len(text)), "tokens": float(len(_WORDS.findall(text)))}
    for name, n in counts.items():
        out[f"script_{name}"] = n / letters if letters else 0.0
    return out


def audio_features(samples: np.ndarray[Any, Any], sample_rate: float | None = None) -> dict[str, Any]:
    """Samples and RMS of a waveform (ints are scaled to [-1, 1]); seconds when the rate is known."""
    x = np.asarray(samples)
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    x = x.astype(np.float32, copy=False).reshape(-1)
    out: dict[str, Any] = {
        "samples": float(x.size),
        "rms": float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0,
    }
    if sample_rate:
        out["sample_rate"] = float(sample_rate)
        out["seconds"] = x.size / float(sample_rate)
    return out


def input_features(modality: Modality, value: Any, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Features of one decoded input value; ``meta`` may carry ``format`` (images) or ``sample_rate`` (audio)."""
    meta = meta or {}
    if modality is Modality.IMAGE and isinstance(value, np.ndarray) and value.ndim in (2, 3):
        return image_features(value, meta.get("format"))
    if modality is Modality.TEXT and isinstance(value, str):
        return text_features(value)
    if modality is Modality.AUDIO and isinstance(value, np.ndarray):
        return audio_features(value, meta.get("sample_rate"))
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
        x = value.astype(np.float64, copy=False)
        return {"size": float(x.size), "mean": float(x.mean()) if x.size else 0.0, "std": float(x.std())}
    return {}
