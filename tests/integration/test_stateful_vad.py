"""The real silero-vad ONNX model as a stateful model: streams of espeak-ng speech batched across sessions
equal each stream run alone (1e-5), and silero's own VADIterator events."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("soxr", reason="needs the audio extra: pip install -e '.[audio]'")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

from usg.errors import GraphError  # noqa: E402
from usg.graph import load_graph  # noqa: E402
from usg.ops.audio import decode_audio  # noqa: E402
from usg.ops.vad import DEFAULT_VAD_MODEL  # noqa: E402
from usg.paths import resolve_path  # noqa: E402
from usg.records import BatchEvent  # noqa: E402
from usg.runtime import Executor  # noqa: E402
from usg.runtime.observer import Observer  # noqa: E402
from usg.stream import SessionLimits, SessionManager  # noqa: E402

RATE = 16_000
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "speech_stream" / "graph.yaml"
PHRASES = ["the quick brown fox jumps over the lazy dog", "seven hundred and forty two apples", "hello there"]


@pytest.fixture(scope="module")
def talks(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """Three different recordings: an espeak-ng phrase between silences of different lengths."""
    d = tmp_path_factory.mktemp("speech")
    out = []
    for i, text in enumerate(PHRASES):
        wav = d / f"p{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en", "-s", "160", "-w", str(wav), text], check=True, capture_output=True)
        lead, tail = np.zeros(RATE * (3 + i) // 10, np.float32), np.zeros(RATE * 6 // 10, np.float32)
        out.append(np.concatenate([lead, decode_audio(wav), tail]))
    return out


class Batches(Observer):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def batch_finished(self, event: BatchEvent) -> None:
        self.sizes.append(event.items)


def _sequential_probs(x: np.ndarray) -> np.ndarray:
    """One stream alone: silero's ONNX session, 64 samples of context, state carried, batch of 1."""
    session = ort.InferenceSession(str(resolve_path(DEFAULT_VAD_MODEL, Path.cwd())), providers=["CPUExecutionProvider"])
    n = -(-x.shape[0] // 512)
    padded = np.zeros(64 + n * 512, np.float32)
    padded[64 : 64 + x.shape[0]] = x
    state = np.zeros((2, 1, 128), np.float32)
    probs = []
    for i in range(n):
        out, state = session.run(
            None, {"input": padded[i * 512 : i * 512 + 576][None], "state": state, "sr": np.array(RATE, np.int64)}
        )
        probs.append(out[0, 0])
    return np.array(probs, np.float32)


def _vad_iterator_events(x: np.ndarray) -> list[tuple[str, int]]:
    import silero_vad
    import torch

    it = silero_vad.VADIterator(silero_vad.load_silero_vad(onnx=True), sampling_rate=RATE)
    n = -(-x.shape[0] // 512)
    padded = np.pad(x, (0, n * 512 - x.shape[0]))
    events = []
    for i in range(n):
        e = it(torch.from_numpy(padded[i * 512 : (i + 1) * 512]))
        if e:
            events += [("speech_start" if k == "start" else "speech_end", int(v)) for k, v in e.items()]
    return events


@pytest.mark.slow
def test_interleaved_streams_batched_equal_each_stream_alone(talks: list[np.ndarray]) -> None:
    graph = load_graph(EXAMPLE)
    batches = Batches()
    streams = talks * 2  # six sessions, two of each recording, at different chunk sizes

    async def run() -> list[list[dict[str, Any]]]:
        limits = SessionLimits(max_chunks_per_s=1e5, burst=10**5, max_pending_chunks=10**4)
        async with Executor(graph, observers=[batches]) as ex, SessionManager(ex, limits) as manager:
            sessions = [manager.open() for _ in streams]
            readers = [asyncio.create_task(_events(s)) for s in sessions]
            sizes = [512, 320, 800, 1024, 512, 2000]
            longest = max(x.shape[0] for x in streams)
            sent = [0] * len(streams)
            for offset in range(0, longest, 160):  # every stream advances by 10 ms a round
                for s, (x, size) in enumerate(zip(streams, sizes, strict=True)):
                    while sent[s] < min(offset + 160, x.shape[0]):
                        chunk = x[sent[s] : sent[s] + size]
                        sessions[s].send("audio", chunk, ts_ms=sent[s] * 1000 / RATE)
                        sent[s] += chunk.shape[0]
                await asyncio.sleep(0)
            await asyncio.gather(*(s.close() for s in sessions))
            return [await r for r in readers]

    results = asyncio.run(run())
    assert max(batches.sizes) > 1  # windows of several streams shared one silero call
    for x, events in zip(streams, results, strict=True):
        probs = np.array([p for e in events if e["type"] == "result" for p in e["outputs"]["probs"]], np.float32)
        ref = _sequential_probs(x)
        assert probs.shape == ref.shape
        assert ref.max() > 0.5  # the recording holds speech
        np.testing.assert_allclose(probs, ref, atol=1e-5)
        ours = [(e["type"], e["sample"]) for e in events if e["type"].startswith("speech") and not e.get("flushed")]
        assert ours == _vad_iterator_events(x)
        assert len(ours) >= 2


async def _events(session: Any) -> list[dict[str, Any]]:
    return [e async for e in session.events()]


def test_a_whole_file_request_gives_the_same_events_as_vad_iterator(talks: list[np.ndarray]) -> None:
    with Executor(load_graph(EXAMPLE)) as ex:
        out = ex.infer_sync({"audio": talks[0]}).outputs
    assert [(e["type"], e["sample"]) for e in out["events"]] == _vad_iterator_events(talks[0])
    np.testing.assert_allclose(out["probs"], _sequential_probs(talks[0]), atol=1e-5)


def test_a_wrong_state_declaration_is_refused_at_load(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace(
        "state: {pairs: {state: stateN}, batch_axis: 1, init: zeros}",
        "state: {pairs: {state: state_out, h: stateN}, batch_axis: 0, init: zeros}",
    )
    bad = tmp_path / "graph.yaml"
    bad.write_text(text)
    with pytest.raises(GraphError) as exc:
        load_graph(bad)
    message = str(exc.value)
    assert "models.silero.state.pairs.state: the model has no output 'state_out'" in message
    assert "fix: name the output holding the next state: one of output, stateN" in message
    assert "models.silero.state.pairs.h: the model has no input 'h'" in message
    assert "input 'state' float32 [2,?,128] has a fixed size 2 on batch_axis 0" in message
