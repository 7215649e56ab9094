"""Node functions of the monitoring test graph (importable as ``monitor_ops``; the e2e server gets this
folder on PYTHONPATH)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def features(text: str) -> dict[str, Any]:
    """A [1, 4] float vector of the text: a batching model's input."""
    return {"x": np.array([[len(text), text.count(" "), sum(c.isdigit() for c in text), 1.0]], dtype=np.float32)}


def scale(inputs: Any) -> dict[str, Any]:
    """A python-backend model: a batch of [n, 4] vectors → a sigmoid score per row."""
    x = np.asarray(inputs["x"], dtype=np.float32)
    return {"score": 1.0 / (1.0 + np.exp(-(x[:, :1] - 20.0) / 10.0))}


def embed(text: str, dim: int = 16) -> dict[str, Any]:
    """A deterministic bag-of-characters embedding, L2-normalised, [1, dim]."""
    v = np.zeros(dim, dtype=np.float32)
    for ch in text.lower():
        v[ord(ch) % dim] += 1.0
    n = float(np.linalg.norm(v))
    return {"embedding": (v / n if n else v).reshape(1, dim)}


def slow_upper(text: str) -> dict[str, Any]:
    """Upper-case ``text``; ``"sleep:0.9 rest"`` sleeps 0.9 s first (the injected slow node)."""
    if text.startswith("sleep:"):
        time.sleep(float(text.split()[0].removeprefix("sleep:")))
    return {"text": text.upper()}


def image_size(image: Any) -> dict[str, Any]:
    return {"size": np.asarray(image.shape[:2], dtype=np.int64)}
