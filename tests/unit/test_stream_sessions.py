"""Streaming sessions with a fake stateful VAD model: ordering, per-stream state, flush, limits, backpressure, wire."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from usg.errors import InputError, Overloaded, PayloadTooLarge, StateError
from usg.graph import GraphBuilder
from usg.graph.model import BatchPolicy
from usg.graph.state import StateSpec
from usg.runtime import Executor
from usg.specs import AudioSpec, TensorSpec
from usg.stream import Session, SessionLimits, SessionManager
from usg.stream.session import error_event
from usg.stream.wire import encode_chunk, parse_binary, parse_text
from usg.testing import FakeBackend

RATE = 16_000
WINDOW = 512


def energy_model(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A fake VAD: probability = 1 when the window is loud; the state counts windows per stream."""
    x, state = inputs["input"], inputs["state"]
    assert x.shape[1] == 64 + WINDOW and state.shape == (2, x.shape[0], 128)
    loud = (np.abs(x[:, 64:]).mean(axis=1, keepdims=True) > 0.1).astype(np.float32)
    new = state.copy()
    new[0, :, 0] += 1
    return {"output": loud, "stateN": new}


def _graph() -> Any:
    return (
        GraphBuilder("vad-fake")
        .input("audio", "audio", audio=AudioSpec(sample_rate=RATE, channels=1, max_seconds=60))
        .model(
            "vad",
            "python",
            batch=BatchPolicy(max_size=16, max_delay_ms=5),
            state=StateSpec({"state": "stateN"}, batch_axis=1),
        )
        .node("windows", fn="usg.ops.vad_stream:vad_windows", inputs={"audio": "inputs.audio"})
        .node("vad", model="vad", map=["input"], inputs={"input": "windows.frames", "sr": "windows.sr"})
        .node("events", fn="usg.ops.vad_stream:speech_events", inputs={"probs": "vad.output", "times": "windows.times"})
        .output("events", "events.events")
        .output("probs", "events.probs")
        .build()
    )


def _fake() -> FakeBackend:
    return FakeBackend(
        energy_model,
        {
            "input": TensorSpec("float32", (None, None)),
            "state": TensorSpec("float32", (2, None, 128)),
            "sr": TensorSpec("int64", ()),
        },
        {"output": TensorSpec("float32", (None, 1)), "stateN": TensorSpec("float32", (2, None, 128))},
    )


def _signal(seed: int) -> np.ndarray:
    """Silence, a loud burst (noise) of 0.6-1.0 s, silence again: one speech segment."""
    rng = np.random.default_rng(seed)
    start = int(RATE * (0.3 + 0.2 * rng.random()))
    x = np.zeros(RATE * 2, np.float32)
    x[start : start + int(RATE * (0.6 + 0.4 * rng.random()))] = 0.3 + 0.5 * rng.random()
    return x


async def _drain(session: Session) -> list[dict[str, Any]]:
    return [e async for e in session.events()]


def _kinds(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["type"], e["sample"]) for e in events if e["type"].startswith("speech")]


def test_interleaved_sessions_equal_one_request_per_stream() -> None:
    fake = _fake()
    signals = [_signal(s) for s in range(4)]

    async def run() -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
        limits = SessionLimits(max_chunks_per_s=10_000, burst=10_000, max_pending_chunks=1000)
        async with Executor(_graph(), backends={"vad": fake}) as ex, SessionManager(ex, limits) as manager:
            whole = [(await ex.infer({"audio": x})).outputs["events"] for x in signals]
            sessions = [manager.open() for _ in signals]
            readers = [asyncio.create_task(_drain(s)) for s in sessions]
            rng = np.random.default_rng(1)
            cuts = [np.cumsum(rng.integers(100, 2000, 64)) for _ in signals]  # uneven chunk sizes
            for step in range(64):
                for s, (x, cut) in enumerate(zip(signals, cuts, strict=True)):
                    lo, hi = (cut[step - 1] if step else 0), cut[step]
                    if lo < x.shape[0]:
                        sessions[s].send("audio", x[lo:hi], ts_ms=1000.0 + lo * 1000 / RATE)
                await asyncio.sleep(0)
            await asyncio.gather(*(s.close() for s in sessions))
            return whole, [await r for r in readers]

    whole, streamed = asyncio.run(run())
    assert max(len(c["input"]) for c in fake.calls) > 1  # windows of different streams shared calls
    for ref, events in zip(whole, streamed, strict=True):
        assert [k for k, _ in _kinds(events)] == ["speech_start", "speech_end"]
        assert _kinds(events) == [(e["type"], e["sample"]) for e in ref]
        start = next(e for e in events if e["type"] == "speech_start")
        assert start["ts_ms"] == pytest.approx(1000.0 + start["sample"] * 1000 / RATE, abs=1e-3)
        assert events[-1] == {"type": "closed", "reason": "client", "chunks": events[-1]["chunks"]}
        seqs = [e["seq"] for e in events if e["type"] == "result"]
        assert seqs == sorted(seqs)  # results come in chunk order


def test_close_flushes_an_open_segment() -> None:
    async def run() -> list[dict[str, Any]]:
        async with Executor(_graph(), backends={"vad": _fake()}) as ex, SessionManager(ex) as manager:
            s = manager.open()
            reader = asyncio.create_task(_drain(s))
            s.send("audio", np.zeros(3000, np.float32), 0.0)
            s.send("audio", np.full(5000, 0.5, np.float32), 187.5)  # speech until the end, 8000 samples
            await s.close()
            return await reader

    events = asyncio.run(run())
    end = [e for e in events if e["type"] == "speech_end"]
    assert len(end) == 1 and end[0]["flushed"] is True
    assert end[0]["sample"] == 8192  # the remainder was zero-padded into a last 512-sample window


def test_limits_refuse_with_the_fix() -> None:
    async def run() -> None:
        limits = SessionLimits(max_chunk_bytes=4096, max_chunks_per_s=5, burst=3, max_sessions=2)
        async with Executor(_graph(), backends={"vad": _fake()}) as ex, SessionManager(ex, limits) as manager:
            s = manager.open()
            with pytest.raises(PayloadTooLarge, match=r"chunk of 8000 bytes .* above the session limit of 4096"):
                s.send("audio", np.zeros(2000, np.float32), 0.0)
            with pytest.raises(InputError, match="unknown input 'video'"):
                s.send("video", b"x", 0.0)
            for i in range(3):
                s.send("audio", np.zeros(512, np.float32), i * 32.0)
            with pytest.raises(Overloaded, match="faster than 5/s \\(burst 3\\)") as exc:
                s.send("audio", np.zeros(512, np.float32), 96.0)
            # the error event a WS client gets names the fix in its `fix` field (it was null)
            assert "raise --stream-limit max_chunks_per_s" in str(error_event(exc.value)["fix"])
            manager.open()
            with pytest.raises(Overloaded, match="2 sessions are open \\(limit 2\\)") as exc:
                manager.open()
            assert "raise --stream-limit max_sessions" in str(error_event(exc.value)["fix"])
            reader = asyncio.create_task(_drain(s))
            await s.close()
            await reader
            with pytest.raises(StateError, match="is closed; fix: open a new session"):
                s.send("audio", np.zeros(512, np.float32), 0.0)

    asyncio.run(run())


def test_a_slow_reader_is_bounded_and_told() -> None:
    async def run() -> tuple[Session, str]:
        limits = SessionLimits(
            max_pending_events=4,
            max_pending_chunks=3,
            max_chunks_per_s=1e6,
            burst=10**6,
            coalesce_chunks=1,
            slow_reader_s=0.5,
        )
        async with Executor(_graph(), backends={"vad": _fake()}) as ex, SessionManager(ex, limits) as manager:
            s = manager.open()
            message = ""
            for i in range(50):  # nobody reads: 4 events queued, then runs stop, then chunks are refused
                try:
                    s.send("audio", np.zeros(512, np.float32), i * 32.0)
                except Overloaded as exc:
                    message = str(exc)
                    break
                await asyncio.sleep(0.01)
            assert s.pending_events == 4 and s.pending_chunks == 3
            assert s.reader_stalled(time.monotonic() + 1.0)
            await manager.aclose()  # shutting down does not wait for a reader that never reads
            assert s.closed and not manager.sessions
            return s, message

    _, message = asyncio.run(run())
    assert "the reader is behind: 4 events unread; fix: read events faster" in message


def test_a_bad_chunk_is_refused_and_a_failed_run_is_an_error_event() -> None:
    def failing(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if float(np.abs(inputs["input"][:, 64:]).max()) > 0.9:  # this window, not its context
            raise ValueError("model blew up")
        return energy_model(inputs)

    async def run() -> list[dict[str, Any]]:
        fake = _fake()
        fake.handler = failing
        async with Executor(_graph(), backends={"vad": fake}) as ex, SessionManager(ex) as manager:
            s = manager.open()
            reader = asyncio.create_task(_drain(s))
            bad = np.zeros(512, np.float32)
            bad[3] = np.nan
            with pytest.raises(InputError, match="audio chunk has NaN or infinite samples"):
                s.send("audio", bad, 0.0)
            with pytest.raises(InputError, match="audio chunk is float64\\[512\\]"):
                s.send("audio", np.zeros(512), 0.0)
            s.send("audio", np.ones(512, np.float32), 0.0)
            await asyncio.sleep(0.2)
            s.send("audio", np.zeros(512, np.float32), 32.0)
            await s.close()
            return await reader

    events = asyncio.run(run())
    error = events[0]
    assert error["type"] == "error" and error["status"] == 500 and error["seq"] == 1
    assert "model 'vad' raised ValueError: model blew up" in error["message"]
    assert [e["type"] for e in events[1:]] == ["result", "closed"]  # the session went on


def test_idle_sessions_are_closed() -> None:
    async def run() -> tuple[list[dict[str, Any]], int]:
        limits = SessionLimits(idle_timeout_s=0.2)
        async with Executor(_graph(), backends={"vad": _fake()}) as ex, SessionManager(ex, limits) as manager:
            s = manager.open()
            s.send("audio", np.zeros(512, np.float32), 0.0)
            events = await asyncio.wait_for(_drain(s), 10)
            return events, len(manager.sessions)

    events, left = asyncio.run(run())
    assert events[-1]["type"] == "closed" and events[-1]["reason"] == "idle_timeout" and left == 0


def test_wire_frames_round_trip_and_errors() -> None:
    graph = _graph()
    pcm = (np.arange(-4, 4) * 4096).astype("<i2")
    chunk = parse_binary(graph, encode_chunk("audio", pcm.tobytes(), 12.5), 1 << 20)
    assert chunk.input == "audio" and chunk.ts_ms == 12.5
    np.testing.assert_array_equal(chunk.value, pcm.astype(np.float32) / 32768)
    f32 = np.linspace(-1, 1, 5, dtype="<f4")
    np.testing.assert_array_equal(parse_binary(graph, encode_chunk("audio", f32.tobytes(), 0, "f32"), 99).value, f32)
    cases = [
        (b"ab", "has no header"),
        (b"\x00\x00\x10\x00{}", "header length 4096 is not within"),
        (b"\x00\x00\x00\x02{x", "header is not JSON"),
        (encode_chunk("video", b"12", 0), "unknown input 'video'"),
        (encode_chunk("audio", b"123", 0), "3 bytes, not a whole number of 2-byte samples"),
        (encode_chunk("audio", b"1234", 0, "mp3"), "format 'mp3'"),
        (encode_chunk("audio", b"", 0), "has no payload"),
    ]
    for frame, message in cases:
        with pytest.raises(InputError, match=message):
            parse_binary(graph, frame, 1 << 20)
    with pytest.raises(InputError, match="chunk ts_ms is 'now'"):
        header = json.dumps({"input": "audio", "ts_ms": "now"}).encode()
        parse_binary(graph, struct.pack(">I", len(header)) + header + b"12", 99)
    with pytest.raises(PayloadTooLarge, match="chunk of 8 bytes"):
        parse_binary(graph, encode_chunk("audio", b"12345678", 0), 4)
    assert parse_text(graph, '{"type": "close"}').kind == "close"
    with pytest.raises(InputError, match="text frame of type 'hello'"):
        parse_text(graph, '{"type": "hello"}')
    with pytest.raises(InputError, match="is a audio input; a text frame carries text"):
        parse_text(graph, '{"type": "chunk", "input": "audio", "ts_ms": 0, "text": "hi"}')
    with pytest.raises(InputError, match="text frame is not JSON"):
        parse_text(graph, "close")


def _binary(header: bytes, payload: bytes = b"\0\0") -> bytes:
    return struct.pack(">I", len(header)) + header + payload


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        # nested past the parser's recursion limit within the 4096-byte header bound
        (_binary(b"[" * 2000 + b"]" * 2000), r"binary frame header nests too deeply"),
        # an integer no float holds (numpy's isfinite raised TypeError on it)
        (
            _binary(b'{"input": "audio", "ts_ms": ' + b"9" * 4000 + b"}"),
            r"binary frame header holds an integer of 4000",
        ),
    ],
    ids=["deep-header", "huge-int-ts"],
)
def test_hostile_binary_headers_are_input_errors_not_a_failed_receiver(frame: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message + ".*; fix: "):
        parse_binary(_graph(), frame, 1 << 20)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, r"text frame nests too deeply"),
        ('{"type": "chunk", "input": "audio", "ts_ms": ' + "9" * 5000 + ', "text": "x"}', "an integer of 5000 digits"),
        ('{"type": "chunk", "input": "audio", "ts_ms": ' + "9" * 400 + ', "text": "x"}', "an integer of 400 digits"),
    ],
    ids=["deep", "huge-int-past-python", "huge-int"],
)
def test_hostile_text_frames_are_input_errors_not_a_failed_receiver(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message + ".*; fix: "):
        parse_text(_graph(), text)


@pytest.mark.timeout(30)
def test_an_output_json_cannot_carry_is_that_chunks_error_event_and_the_session_goes_on() -> None:
    """The output's BackendError (to_jsonable) was raised past the run's error handling: the session's
    pump ended with it, the chunk got no event and the chunks behind it waited."""
    graph = (
        GraphBuilder("obj")
        .input("text", "text")
        .node("n", fn="testops:an_object", inputs={"text": "inputs.text"})
        .output("y", "n.text")
        .build()
    )

    async def run() -> list[dict[str, Any]]:
        async with Executor(graph) as ex, SessionManager(ex) as manager:
            s = manager.open()
            reader = asyncio.create_task(_drain(s))
            s.send("text", "a", 0.0)
            s.send("text", "b", 10.0)
            await s.close()
            return await reader

    events = asyncio.run(run())
    errors = [e for e in events if e["type"] == "error"]
    assert [e["seq"] for e in errors] == [1, 2], events
    assert errors[0]["message"].startswith("output 'y' is a object, which JSON cannot carry"), errors[0]
    assert events[-1]["type"] == "closed"
