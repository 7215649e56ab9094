"""Node functions used by the unit-test graphs (importable as ``testops:NAME``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from usg.ops.signature import ListOf, op
from usg.specs import TensorSpec


def identity(x: Any) -> dict[str, Any]:
    return {"y": x}


@op(
    inputs={"x": TensorSpec("float32", (1, None))},
    outputs={"items": ListOf(TensorSpec("float32", (1, None)))},
)
def split_rows(x: np.ndarray, *, parts: int = 3) -> dict[str, Any]:
    return {"items": [x * (i + 1) for i in range(parts)]}


def upper(text: str) -> dict[str, Any]:
    return {"text": text.upper()}


def logged_upper(text: str, *, log: str) -> dict[str, Any]:
    """upper, appending each computed text to the file ``log`` (a cache test counts computations)."""
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return {"text": text.upper()}


def router_pid(text: str) -> dict[str, Any]:
    """The process that ran the node (in the Ray engine: the router replica)."""
    import os

    return {"pid": str(os.getpid())}


def length(text: str) -> dict[str, Any]:
    return {"n": np.array([[len(text)]], dtype=np.float32)}


def nothing(text: str) -> dict[str, Any]:
    return {"text": None}


def sleepy(text: str, *, seconds: float = 1.0) -> dict[str, Any]:
    time.sleep(seconds)
    return {"text": text}


def boom(text: str) -> dict[str, Any]:
    raise RuntimeError("kaboom")


def not_a_dict(text: str) -> Any:
    return [text]


@op(outputs={"hwc": TensorSpec("uint8", ("H", "W", 3), layout="HWC")})
def raw_image(image: np.ndarray) -> dict[str, Any]:
    return {"hwc": image}


def to_rec(x: np.ndarray) -> dict[str, Any]:
    """NCHW float image in [0,1] → a PP-OCR rec input (48 px high, normalised to [-1,1])."""
    import cv2

    img = cv2.resize(x[0].transpose(1, 2, 0), (200, 48))
    return {"x": np.ascontiguousarray(((img - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32))}


@op(inputs={"x": TensorSpec("float32", (1, None))}, outputs={"y": TensorSpec("float32", (1, None))})
def negate(x: np.ndarray) -> dict[str, Any]:
    """A tensor-in, tensor-out node (an ensemble step when exported to Triton)."""
    return {"y": -x}


@op(outputs={"n": TensorSpec("float32", (1, 1))})
def text_length(text: str, *, scale: float = 1.0) -> dict[str, Any]:
    return {"n": np.array([[len(text) * scale]], dtype=np.float32)}


def doubled(inputs: Any) -> dict[str, Any]:
    """A python-backend model: a dict of batched arrays in, ``y = 2 x`` out (batch size kept)."""
    return {"y": np.asarray(inputs["x"]) * 2}


@op(inputs={"audio": None}, outputs={"level": None, "seen": None, "ts": None, "flush": None}, inline=True)
def chunk_level(
    audio: np.ndarray,
    *,
    quiet: float = 0.01,
    session_state: dict[str, Any] | None = None,
    ts_ms: float = 0.0,
    flush: bool = True,
) -> dict[str, Any]:
    """A stream op run on the loop: the chunk's mean level (None when quiet: its branch is
    skipped), chunks seen so far; a chunk starting with the sample 0.75 raises."""
    st = session_state if session_state is not None else {}
    st["seen"] = st.get("seen", 0) + 1
    if audio.size and float(audio[0]) == 0.75:
        raise ValueError("marker sample")
    level = float(np.abs(audio).mean()) if audio.size else 0.0
    return {"level": level if level > quiet else None, "seen": st["seen"], "ts": ts_ms, "flush": flush}


def level_db(level: float, seen: int) -> dict[str, Any]:
    """Runs on a worker thread (not an op declared inline)."""
    return {"db": round(20 * float(np.log10(level)), 6), "seen": seen}


def wrong_port(text: str) -> dict[str, Any]:
    return {"nope": text}


def an_object(text: str) -> dict[str, Any]:
    return {"text": object()}


def exits(text: str) -> dict[str, Any]:
    raise SystemExit(3)


def interrupts(inputs: Any) -> dict[str, Any]:
    raise KeyboardInterrupt
