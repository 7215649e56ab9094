"""Streaming voice activity detection: audio chunks → silero windows → speech start / end events.

Two node functions for a graph run once per chunk of a session (:mod:`usg.stream`), around a
*stateful* silero-vad model node (``state: {pairs: {state: stateN}, batch_axis: 1}``), so the
model's recurrent state is kept per stream by the executor and chunks of many streams share
one batched model call:

- :func:`vad_windows` cuts the chunk into 512-sample windows (256 at 8 kHz), each preceded
  by the last 64 (32) samples before it, keeping the remainder and the context for the next
  chunk in the node's ``session_state``; on ``flush`` the remainder is zero-padded into a last
  window;
- :func:`speech_events` applies the rules of silero's ``VADIterator`` (speech starts at a
  window ``>= threshold``, padded back by ``speech_pad_ms``; ends after ``min_silence_ms`` below
  ``threshold - 0.15``) and turns the sample positions into ``speech_start`` / ``speech_end``
  events with the capture time (``ts_ms``) of the chunk they fall in; on ``flush`` an open
  segment ends at the end of the stream.

Run on a whole recording (one request: one stream, flushed at its end) they give the same
events as ``VADIterator`` over the same windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from usg.errors import InputError
from usg.ops.signature import ListOf, op
from usg.ops.vad import vad_window
from usg.specs import TensorSpec

__all__ = ["speech_events", "vad_windows"]

_CONTEXT = {16_000: 64, 8_000: 32}


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


#: the ``sr`` output per rate and an empty remainder: shared, read-only (one less array per chunk)
_SR = {rate: _frozen(np.array(rate, dtype=np.int64)) for rate in _CONTEXT}
_EMPTY = _frozen(np.zeros(0, np.float32))


def _capture_ms(k: int, n_rest: int, rest_ts: float, ts_ms: float, rate: int) -> float:
    """Capture time of sample ``k`` of rest + chunk (the rest from earlier chunks, then this one)."""
    return rest_ts + k * 1000.0 / rate if k < n_rest else ts_ms + (k - n_rest) * 1000.0 / rate


@op(
    inputs={"audio": TensorSpec("float32", ("T",))},
    outputs={"frames": ListOf(TensorSpec("float32", (1, None))), "sr": TensorSpec("int64", ()), "times": None},
    inline=True,
)
def vad_windows(
    audio: np.ndarray,
    sample_rate: int = 16_000,
    session_state: dict[str, Any] | None = None,
    ts_ms: float = 0.0,
    flush: bool = True,
) -> dict[str, Any]:
    """A chunk of mono samples → ``frames`` (``[1, context + window]`` each), ``sr`` and ``times``:
    per window ``[its first sample's position in the stream, that sample's capture time in ms]``.

    Run once per chunk on the event loop (``inline``), so it copies each sample once: the context,
    the remainder of earlier chunks, the chunk (and, on ``flush``, zeros) go into one buffer the
    windows are views of."""
    window = vad_window(sample_rate)
    context = _CONTEXT[sample_rate]
    x = audio if isinstance(audio, np.ndarray) and audio.dtype == np.float32 else np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise InputError(f"vad: audio has shape {list(x.shape)}", field="audio", fix="send mono audio (channels: 1)")
    st = session_state if session_state is not None else {}
    rest: np.ndarray | None = st.get("rest")
    ctx: np.ndarray | None = st.get("context")
    pos = int(st.get("pos", 0))  # stream position of rest[0]
    rest_ts = float(st.get("rest_ts", ts_ms))
    n_rest = 0 if rest is None else rest.shape[0]
    total = n_rest + x.shape[0]
    n = total // window
    if flush and total > n * window:
        n += 1  # the remainder, zero-padded into a last window
    if n:
        full = np.empty(context + n * window, np.float32)
        full[:context] = 0.0 if ctx is None else ctx
        k = context
        if n_rest:  # shorter than a window: all of it goes into this chunk's windows
            full[k : k + n_rest] = rest
            k += n_rest
        take = min(x.shape[0], full.shape[0] - k)
        full[k : k + take] = x[:take]
        if k + take < full.shape[0]:
            full[k + take :] = 0.0
        st["rest"] = x[take:].copy() if take < x.shape[0] else _EMPTY
        st["context"] = full[-context:].copy()
    else:  # no whole window yet: the samples wait for the next chunk
        full = np.zeros(0, np.float32)
        st["rest"] = np.concatenate([rest, x]) if n_rest else x.copy()
        st["context"] = np.zeros(context, np.float32) if ctx is None else ctx.copy()
    frames = [full[i * window : i * window + context + window][None] for i in range(n)]
    times = [[pos + i * window, _capture_ms(i * window, n_rest, rest_ts, ts_ms, sample_rate)] for i in range(n)]
    st["pos"] = pos + n * window
    st["rest_ts"] = _capture_ms(n * window, n_rest, rest_ts, ts_ms, sample_rate)
    return {"frames": frames, "sr": _SR[sample_rate], "times": times}


@op(
    inputs={"probs": ListOf(TensorSpec("float32", (1, 1))), "times": None},
    outputs={"events": None, "probs": None},
    inline=True,
)
def speech_events(
    probs: list[np.ndarray],
    times: list[list[float]],
    sample_rate: int = 16_000,
    threshold: float = 0.5,
    min_silence_ms: float = 100.0,
    speech_pad_ms: float = 30.0,
    session_state: dict[str, Any] | None = None,
    flush: bool = True,
) -> dict[str, Any]:
    """Window probabilities → ``events`` (``speech_start`` / ``speech_end``, silero ``VADIterator``
    rules) and ``probs`` (the windows' probabilities as floats)."""
    window = vad_window(sample_rate)
    st = session_state if session_state is not None else {}
    triggered = bool(st.get("triggered", False))
    temp_end = int(st.get("temp_end", 0))
    anchor: list[float] = st.get("anchor", [0, 0.0])  # a window's [stream position, capture ms]
    min_silence = sample_rate * min_silence_ms / 1000
    pad = sample_rate * speech_pad_ms / 1000
    events: list[dict[str, Any]] = []
    values = [p.item(0) if isinstance(p, np.ndarray) else float(np.asarray(p).reshape(-1)[0]) for p in probs]

    def event(kind: str, sample: float) -> dict[str, Any]:
        ts = anchor[1] + (sample - anchor[0]) * 1000.0 / sample_rate
        return {
            "type": kind,
            "sample": int(sample),
            "stream_ms": round(sample * 1000.0 / sample_rate, 3),
            "ts_ms": round(ts, 3),
        }

    for p, (at, ts) in zip(values, times, strict=True):
        anchor = [at, ts]
        current = int(at) + window  # VADIterator counts the window before it looks at it
        if p >= threshold and temp_end:
            temp_end = 0
        if p >= threshold and not triggered:
            triggered = True
            events.append(event("speech_start", max(0, current - pad - window)))
            continue
        if p < threshold - 0.15 and triggered:
            if not temp_end:
                temp_end = int(current)
            if current - temp_end >= min_silence:
                events.append(event("speech_end", temp_end + pad - window))
                temp_end, triggered = 0, False
    if flush and triggered:
        events.append({**event("speech_end", anchor[0] + window), "flushed": True})
        triggered, temp_end = False, 0
    st.update(triggered=triggered, temp_end=temp_end, anchor=anchor)
    return {"events": events, "probs": values}
