"""The frames of ``WS /v1/stream/{graph}`` (docs/streaming.md has the full description).

Client → server:

- a **binary frame** is one chunk: a 4-byte big-endian header length ``N``, ``N`` bytes of
  UTF-8 JSON header ``{"input": NAME, "ts_ms": CAPTURE_MS, "format": FORMAT}``, then the
  payload. Audio: ``format`` ``pcm16`` (default; little-endian int16) or ``f32``
  (little-endian float32), mono, at the input's ``sample_rate``. Image: the encoded file
  (PNG/JPEG/...). Text: UTF-8.
- a **text frame** is JSON: ``{"type": "chunk", "input": NAME, "ts_ms": MS, "text": "..."}`` (a
  text chunk), or ``{"type": "close"}`` (flush and close).

Server → client: text frames, one JSON event each (``session`` first, ``closed`` last).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from usg.errors import InputError, PayloadTooLarge
from usg.graph.model import Graph
from usg.specs import Modality

__all__ = ["MAX_HEADER_BYTES", "WireChunk", "encode_chunk", "parse_binary", "parse_text"]

MAX_HEADER_BYTES = 4096
_FORMATS = ("pcm16", "f32")
_FRAME_FIX = (
    "send a binary frame: 4-byte big-endian header length, a JSON header "
    '{"input": NAME, "ts_ms": MS, "format": "pcm16"|"f32"}, then the payload (docs/streaming.md)'
)


@dataclass(frozen=True)
class WireChunk:
    """A parsed client frame: a chunk (``input``, ``value``, ``ts_ms``) or a ``close`` request."""

    kind: str  # "chunk" | "close"
    input: str = ""
    value: Any = None
    ts_ms: float = 0.0


def encode_chunk(name: str, payload: bytes, ts_ms: float, fmt: str | None = None) -> bytes:
    """A binary chunk frame (what clients send; used by tests and the benchmark)."""
    header: dict[str, Any] = {"input": name, "ts_ms": ts_ms}
    if fmt is not None:
        header["format"] = fmt
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + raw + payload


_MAX_INT_DIGITS = 20  # an int64 capture time in ms fits; longer integers are refused while parsing


def _load(raw: bytes | str, what: str, fix: str) -> Any:
    """JSON of a client frame; anything the parser refuses — including nesting past its recursion
    limit and integers of more than 20 digits — is an InputError naming ``what``."""

    def bounded_int(digits: str) -> int:
        n = len(digits.lstrip("-"))
        if n > _MAX_INT_DIGITS:
            raise InputError(
                f"{what} holds an integer of {n} digits (at most {_MAX_INT_DIGITS})", field="frame", fix=fix
            )
        return int(digits)

    try:
        return json.loads(raw, parse_int=bounded_int)
    except RecursionError:
        raise InputError(f"{what} nests too deeply", field="frame", fix=fix) from None
    except (UnicodeDecodeError, ValueError):  # json.JSONDecodeError is a ValueError
        raise InputError(f"{what} is not JSON", field="frame", fix=fix) from None


def _ts(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(
            f"chunk ts_ms is {value!r}", field="ts_ms", fix="send the chunk's capture time in ms as a number"
        )
    return float(value)


def _input(graph: Graph, name: Any) -> Any:
    d = graph.inputs.get(name) if isinstance(name, str) else None
    if d is None:
        raise InputError(
            f"chunk for unknown input {name!r}",
            field="input",
            fix=f"name one of the graph's inputs: {', '.join(sorted(graph.inputs))}",
        )
    return d


def parse_binary(graph: Graph, frame: bytes, max_chunk_bytes: int) -> WireChunk:
    """A binary frame → a chunk; a malformed one is an InputError naming the field and the fix."""
    if len(frame) < 4:
        raise InputError(f"binary frame of {len(frame)} bytes has no header", field="frame", fix=_FRAME_FIX)
    (n,) = struct.unpack(">I", frame[:4])
    if n == 0 or n > MAX_HEADER_BYTES or 4 + n > len(frame):
        raise InputError(
            f"binary frame header length {n} is not within 1..{min(MAX_HEADER_BYTES, len(frame) - 4)}",
            field="frame",
            fix=_FRAME_FIX,
        )
    header = _load(frame[4 : 4 + n], "binary frame header", _FRAME_FIX)
    if not isinstance(header, dict):
        raise InputError("binary frame header is not a JSON object", field="frame", fix=_FRAME_FIX)
    d = _input(graph, header.get("input"))
    ts = _ts(header.get("ts_ms"))
    payload = frame[4 + n :]
    if len(payload) > max_chunk_bytes:
        raise PayloadTooLarge(
            f"chunk of {len(payload)} bytes for {d.name!r} is above the session limit of {max_chunk_bytes} bytes",
            field="chunk",
            fix="send smaller chunks (e.g. 20-100 ms of audio), or raise --stream-limit max_chunk_bytes",
        )
    if not payload:
        raise InputError(f"chunk for {d.name!r} has no payload", field="chunk", fix="send at least one sample")
    if d.modality is Modality.AUDIO:
        return WireChunk("chunk", d.name, _audio(d.name, payload, header.get("format", "pcm16")), ts)
    if d.modality is Modality.TEXT:
        return WireChunk("chunk", d.name, payload, ts)  # bytes: normalize_inputs decodes UTF-8
    if d.modality is Modality.IMAGE:
        return WireChunk("chunk", d.name, payload, ts)
    raise InputError(
        f"input {d.name!r} is a {d.modality.value} input; chunks carry audio, images or text",
        field="input",
        fix="stream to an audio, image or text input",
    )


def _audio(name: str, payload: bytes, fmt: Any) -> np.ndarray:
    if fmt not in _FORMATS:
        raise InputError(f"audio chunk format {fmt!r}", field="format", fix="use format pcm16 or f32")
    width = 2 if fmt == "pcm16" else 4
    if len(payload) % width:
        raise InputError(
            f"{fmt} chunk for {name!r} has {len(payload)} bytes, not a whole number of {width}-byte samples",
            field="chunk",
            fix=f"send whole samples ({width} bytes each, little-endian, mono)",
        )
    if fmt == "pcm16":
        return np.frombuffer(payload, "<i2").astype(np.float32) / 32768.0
    samples = np.frombuffer(payload, "<f4").astype(np.float32)
    if not np.isfinite(samples).all():
        raise InputError(
            f"f32 chunk for {name!r} has NaN or infinite samples", field="chunk", fix="send finite samples"
        )
    return samples


def parse_text(graph: Graph, text: str) -> WireChunk:
    """A text frame → a text chunk or a close request."""
    fix = 'send {"type": "chunk", "input": NAME, "ts_ms": MS, "text": "..."} or {"type": "close"}'
    msg = _load(text, "text frame", fix)
    if not isinstance(msg, dict) or msg.get("type") not in ("chunk", "close"):
        kind = msg.get("type") if isinstance(msg, dict) else type(msg).__name__
        raise InputError(f"text frame of type {kind!r}", field="type", fix=fix)
    if msg["type"] == "close":
        return WireChunk("close")
    d = _input(graph, msg.get("input"))
    if not isinstance(msg.get("text"), str):
        raise InputError("text chunk has no string 'text'", field="text", fix=fix)
    if d.modality is not Modality.TEXT:
        raise InputError(
            f"input {d.name!r} is a {d.modality.value} input; a text frame carries text",
            field="input",
            fix="send audio and images as binary frames",
        )
    return WireChunk("chunk", d.name, msg["text"], _ts(msg.get("ts_ms")))
