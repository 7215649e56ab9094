"""``WS /v1/stream/{graph}`` on real ``usg serve`` processes with a websockets client: concurrent sessions of
espeak-ng speech give the events of ``usg run`` on the whole file; hostile clients (oversized chunk, too fast,
bad frames, idle, a reader that stops reading) are answered and bounded, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sf = pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
websockets = pytest.importorskip("websockets", reason="needs websockets (usg[test])")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

from harness import ROOT, SERVE_RESOURCES, USG, Server, start_server  # noqa: E402

from usg.stream.wire import encode_chunk  # noqa: E402

GRAPH = ROOT / "examples" / "speech_stream" / "graph.yaml"
RATE = 16_000
LIMITS = ["max_chunk_bytes=65536", "max_chunks_per_s=60", "burst=20", "idle_timeout_s=2"]


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("talk") / "talk.wav"
    sample = ROOT / "examples" / "speech_segments" / "make_sample.py"
    subprocess.run([sys.executable, str(sample), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [a for limit in LIMITS for a in ("--stream-limit", limit)]
    s = start_server(GRAPH, *args, tmp=tmp_path_factory.mktemp("serve"))
    yield s
    s.stop()


def _url(server: Server, graph: str = "speech-stream") -> str:
    return f"ws://127.0.0.1:{server.port}/v1/stream/{graph}"


async def _stream(url: str, pcm: np.ndarray, chunk: int = 1600, pace_s: float = 0.02) -> list[dict[str, Any]]:
    """Send PCM16 chunks (paced under the rate limit), then close; every event received."""
    async with websockets.connect(url) as ws:
        hello = json.loads(await ws.recv())
        assert hello["type"] == "session" and hello["inputs"]["audio"]["sample_rate"] == RATE

        async def reader() -> list[dict[str, Any]]:
            return [json.loads(m) async for m in ws]

        events = asyncio.create_task(reader())
        for i in range(0, pcm.shape[0], chunk):
            await ws.send(encode_chunk("audio", pcm[i : i + chunk].tobytes(), 1000.0 + i * 1000 / RATE))
            await asyncio.sleep(pace_s)
        await ws.send(json.dumps({"type": "close"}))
        out = await events
        assert ws.close_code == 1000
        return out


async def _all(ws: Any) -> list[dict[str, Any]]:
    """Every event until the server closes, whatever the close code."""
    out = []
    try:
        while True:
            out.append(json.loads(await ws.recv()))
    except websockets.ConnectionClosed:
        return out


def _speech(events: list[dict[str, Any]]) -> list[tuple[str, float]]:
    return [(e["type"], e["stream_ms"]) for e in events if e["type"].startswith("speech")]


@pytest.mark.slow
def test_concurrent_sessions_give_the_events_of_usg_run(server: Server, talk: Path) -> None:
    cli = subprocess.run(
        [str(USG), "run", str(GRAPH), "-i", f"audio={talk}", "--json"], capture_output=True, check=True, timeout=180
    )
    expected = [(e["type"], e["stream_ms"]) for e in json.loads(cli.stdout)["outputs"]["events"]]
    assert [k for k, _ in expected] == ["speech_start", "speech_end"] * 2
    x, rate = sf.read(talk, dtype="int16")
    assert rate == RATE

    async def run() -> list[list[dict[str, Any]]]:
        return list(await asyncio.gather(*(_stream(_url(server), x) for _ in range(6))))

    for events in asyncio.run(run()):
        assert _speech(events) == expected
        start = next(e for e in events if e["type"] == "speech_start")
        assert start["ts_ms"] == pytest.approx(1000.0 + start["stream_ms"], abs=1e-3)  # capture time
        others = [e for e in events if e["type"] not in ("result", "speech_start", "speech_end")]
        assert [e["type"] for e in others] == ["closed"], others  # an error event is shown whole


def test_hostile_frames_are_answered_and_the_session_goes_on(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(_url(server)) as ws:
            await ws.recv()
            await ws.send(encode_chunk("audio", b"\x00\x01" * 40_000, 0.0))  # 80 kB > max_chunk_bytes
            await ws.send(b"xx")
            await ws.send("not json")
            await ws.send(encode_chunk("audio", b"\x00" * 3, 0.0))
            await ws.send(encode_chunk("video", b"\x00" * 4, 0.0))
            deep = b"[" * 2000 + b"]" * 2000  # past the JSON parser's recursion limit: the session used to end 1011
            await ws.send(len(deep).to_bytes(4, "big") + deep + b"\x00\x00")
            await ws.send("[" * 50_000 + "]" * 50_000)
            await asyncio.sleep(1.0)  # the rate limit's bucket refills
            await ws.send(encode_chunk("audio", b"\x00\x00" * 512, 32.0))
            await ws.send(json.dumps({"type": "close"}))
            return [json.loads(m) async for m in ws]

    events = asyncio.run(run())
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["status"], e["field"]) for e in errors] == [
        (413, "chunk"),
        (400, "frame"),
        (400, "frame"),
        (400, "chunk"),
        (400, "input"),
        (400, "frame"),
        (400, "frame"),
    ]
    assert "above the session limit of 65536 bytes" in errors[0]["message"]
    assert "--stream-limit max_chunk_bytes" in errors[0]["fix"]
    assert "not a whole number of 2-byte samples" in errors[3]["message"]
    assert "speech-stream" not in errors[4]["message"] and "audio" in errors[4]["fix"]
    assert [e["message"] for e in errors[5:]] == ["binary frame header nests too deeply", "text frame nests too deeply"]
    assert [e["type"] for e in events if e["type"] != "error"] == ["result", "closed"]


def test_a_frame_far_above_the_chunk_limit_is_not_read_whole(server: Server) -> None:
    """The WebSocket library reads a frame whole before the session sees it: frames above twice the
    session's chunk limit (65536 here) are refused by the library with 1009, naming its limit."""

    async def run() -> tuple[int | None, str, dict[str, Any]]:
        async with websockets.connect(_url(server), max_size=None) as ws:
            await ws.recv()
            await ws.send(encode_chunk("audio", b"\x00\x01" * 4 * 1024 * 1024, 0.0))  # 8 MiB
            try:
                while True:
                    await ws.recv()
            except websockets.ConnectionClosed as closed:
                code, reason = closed.rcvd.code if closed.rcvd else None, closed.rcvd.reason if closed.rcvd else ""
        async with websockets.connect(_url(server)) as ws:  # the server goes on
            return code, reason, json.loads(await ws.recv())

    code, reason, first = asyncio.run(run())
    assert code == 1009, (code, reason)
    assert str(2 * 65536 + 4 + 4096) in reason
    assert first["type"] == "session"


def test_too_fast_is_refused_with_retry_after(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(_url(server)) as ws:
            await ws.recv()
            for i in range(40):  # no pacing: the burst of 20 runs out
                await ws.send(encode_chunk("audio", b"\x00\x00" * 512, i * 32.0))
            await asyncio.sleep(0.5)
            await ws.send(json.dumps({"type": "close"}))
            return [json.loads(m) async for m in ws]

    events = asyncio.run(run())
    refused = [e for e in events if e["type"] == "error"]
    assert refused and all(e["status"] == 429 and "faster than 60/s (burst 20)" in e["message"] for e in refused)
    assert refused[0]["retry_after_s"] == pytest.approx(1 / 60)
    assert len([e for e in events if e["type"] == "result"]) == 40 - len(refused) or events[-1]["type"] == "closed"


def test_an_idle_session_is_flushed_and_closed(server: Server) -> None:
    async def run() -> tuple[list[dict[str, Any]], int | None]:
        async with websockets.connect(_url(server)) as ws:
            await ws.recv()
            await ws.send(encode_chunk("audio", (np.ones(800) * 16000).astype("<i2").tobytes(), 0.0))
            events = await _all(ws)  # nothing more is sent: the server ends it
            return events, ws.close_code

    events, code = asyncio.run(run())
    assert code == 4408
    assert events[-1] == {"type": "closed", "reason": "idle_timeout", "chunks": 2}  # the chunk and the flush run


def _rejected(server: Server, reason: str) -> float:
    import httpx

    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith(f'usg_rejected_requests_total{{reason="{reason}"}}'))
    return float(line.split()[-1])


def test_unknown_graph_is_refused(server: Server) -> None:
    before = _rejected(server, "bad_input")

    async def run() -> tuple[dict[str, Any], int | None]:
        async with websockets.connect(_url(server, "nope")) as ws:
            first = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return first, ws.close_code

    first, code = asyncio.run(run())
    assert code == 1008 and first["field"] == "graph" and "/v1/stream/speech-stream" in first["fix"]
    assert _rejected(server, "bad_input") == before + 1  # a refused session is counted as HTTP refusals are


def _stalled_client(port: int, path: str, chunks: int, text: str) -> tuple[list[Any], bool]:
    """A WebSocket client (websockets' sans-I/O protocol on a plain socket with a 4 kB receive buffer) that
    sends ``chunks`` text chunks and never reads, then reads what the server left: the frames, and whether
    the server ended the connection (a reset or EOF) before this client's own 30 s socket timeout did."""
    import socket

    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}{path}"), max_size=None)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    proto.send_request(proto.connect())
    sock.sendall(b"".join(proto.data_to_send()))
    while proto.handshake_exc is None and not proto.events_received() and not getattr(proto, "response", None):
        proto.receive_data(sock.recv(4096))
    sock.settimeout(30)
    ended_by_server = False
    try:
        for i in range(chunks):
            proto.send_text(json.dumps({"type": "chunk", "input": "text", "ts_ms": i, "text": text}).encode())
            sock.sendall(b"".join(proto.data_to_send()))
    except TimeoutError:
        pass  # the server neither read nor closed: only our own timeout ended the sending
    except OSError:
        ended_by_server = True  # the server cut the connection while we were still sending
    frames: list[Any] = []
    try:
        while data := sock.recv(1 << 16):  # now read: what was buffered, then the server's close (or EOF)
            proto.receive_data(data)
            frames += proto.events_received()
        ended_by_server = True
    except TimeoutError:
        pass
    except OSError:
        ended_by_server = True
    sock.close()
    return frames, ended_by_server


@pytest.mark.slow
def test_a_reader_that_stops_reading_is_cut_off(tmp_path: Path) -> None:
    """Events of 150 kB (the slow graph echoes text chunks); the client never reads: the server's event queue
    holds 4, then it stops running chunks, refuses new ones, and closes the session after slow_reader_s; the
    connection, which the client still does not read (nor close), is reset after --send-timeout, not held."""
    limits = ["max_pending_events=4", "slow_reader_s=1", "max_chunks_per_s=1000", "burst=1000"]
    s = start_server(
        SERVE_RESOURCES / "slow.yaml",
        *[a for lim in limits for a in ("--stream-limit", lim)],
        "--send-timeout",
        "3",
        tmp=tmp_path,
    )
    try:
        frames, ended_by_server = _stalled_client(s.port, "/v1/stream/slow", 300, "x" * 150_000)
        assert "slow reader, 4 events unread for over 1 s; closing with 1013" in s.output()
        # before --send-timeout, the server stopped reading and kept the connection until the client gave up
        assert ended_by_server, s.output()[-2000:]
        assert "left" in s.output() and "unread for 3 s (--send-timeout); connection aborted" in s.output()
        # what reached the client is bounded: a few events (socket buffers), not the 400 chunks' results
        results = [f for f in frames if getattr(f, "opcode", None) is not None and f.opcode.name == "TEXT"]
        assert len(results) < 120  # 4 MB of kernel send buffer hold ~27 events

        async def again() -> list[dict[str, Any]]:  # the server is fine: a new session runs
            async with websockets.connect(_url(s, "slow")) as ws:
                await ws.recv()
                await ws.send(json.dumps({"type": "chunk", "input": "text", "ts_ms": 0, "text": "hi"}))
                await ws.send(json.dumps({"type": "close"}))
                return [json.loads(m) async for m in ws]

        events = asyncio.run(again())
        assert events[0]["outputs"] == {"echo": "hi", "length": 2} and events[-1]["type"] == "closed"
    finally:
        s.stop()


@pytest.mark.slow
def test_sessions_under_the_ray_engine_give_the_events_of_the_embedded_engine(
    server: Server, talk: Path, ray_head: Any, tmp_path: Path
) -> None:
    """``usg serve --engine ray`` joined to the session's Ray cluster: silero runs in its own deployment
    (each chunk's state goes to any replica with the chunk and comes back with the reply), the VAD
    segmenter (a stream node) in the router's session; concurrent sessions see the embedded server's events."""
    import httpx

    x, _ = sf.read(talk, dtype="int16")
    embedded = asyncio.run(_stream(_url(server), x))
    # the file is sent at 5x real time by each of 3 sessions: on a slow host the Ray deployment falls behind and
    # the session rightly refuses chunks past max_pending_chunks (429 Overloaded, a gap in the audio). This test is
    # about the events being equal, not about keeping up: every chunk of the file (~100) may wait.
    args = [a for limit in [*LIMITS, "max_pending_chunks=256"] for a in ("--stream-limit", limit)]
    ray = start_server(
        GRAPH,
        "--engine",
        "ray",
        "--ray-address",
        ray_head.address,
        *args,
        tmp=tmp_path,
        env=ray_head.env,
        port=ray_head.serve_port,
    )
    try:

        async def run() -> list[list[dict[str, Any]]]:
            return list(await asyncio.gather(*(_stream(_url(ray), x) for _ in range(3))))

        sessions = asyncio.run(run())
        metrics = httpx.get(f"{ray.url}/metrics", timeout=30).text
    finally:
        code = ray.stop()
    assert code == 0, ray.output()[-3000:]
    assert "model-silero, router" in " ".join(ray.output().split())

    def speech(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # which waiting chunks ran as one (seq, first_seq) depends on timing; the rest may not
        return [
            {k: v for k, v in e.items() if k not in ("seq", "first_seq")}
            for e in events
            if e["type"].startswith("speech")
        ]

    assert [e["type"] for e in speech(embedded)] == ["speech_start", "speech_end"] * 2
    for events in sessions:
        others = [e for e in events if e["type"] not in ("result", "speech_start", "speech_end")]
        assert [e["type"] for e in others] == ["closed"], others  # an error event is shown whole
        assert speech(events) == speech(embedded)  # sample, stream_ms, ts_ms, input
        assert events[-1] == embedded[-1]  # closed by the client after the same number of chunks
    # the windows crossed to the model's deployment, and the replies came back (state included)
    assert 'direction="request",target="model-silero"' in metrics
    assert 'direction="reply",target="model-silero"' in metrics
