"""A real ``usg serve`` of the speech-segments example with compressed audio (PyAV-encoded espeak-ng
speech): ``usg run -i audio=FILE``, multipart, JSON base64, OIP v2 BYTES (tritonclient, binary and JSON), 400 / 413."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("av", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources"))
from harness import ROOT, USG, Server, start_server
from media import encode_av, espeak

pytestmark = pytest.mark.slow  # one server, one `usg run`: ~40 s on 2 shared cores

GRAPH = ROOT / "examples" / "speech_segments" / "graph.yaml"
RATE = 16_000


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Two espeak-ng phrases, 0.7 s of silence before, 1.2 s between, 0.6 s after."""
    gap = [np.zeros(RATE * ms // 1000, np.float32) for ms in (700, 1200, 600)]
    a, b = espeak("the quick brown fox jumps over the lazy dog"), espeak("seven hundred and forty two apples")
    return np.concatenate([gap[0], a, gap[1], b, gap[2]])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(GRAPH, tmp=tmp_path_factory.mktemp("audio-formats"))
    yield s
    assert s.stop() == 0, s.output()


def _ms(segments: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(s["start_ms"], s["end_ms"]) for s in segments]


def _close(got: list[tuple[float, float]], want: list[tuple[float, float]]) -> bool:
    """Same segments within 3 VAD frames (96 ms): lossy codecs move a frame's probability a little."""
    return len(got) == len(want) and all(
        abs(g - w) <= 96 for gs, ws in zip(got, want, strict=True) for g, w in zip(gs, ws, strict=True)
    )


def test_usg_run_and_multipart_agree_on_each_compressed_format(
    server: Server, speech: np.ndarray, tmp_path: Path
) -> None:
    path = tmp_path / "talk.mp3"
    path.write_bytes(encode_av(speech, "mp3"))
    cli = subprocess.run(
        [str(USG), "run", str(GRAPH), "-i", f"audio={path}", "--json"], capture_output=True, check=True, timeout=120
    )
    expected = json.loads(cli.stdout)["outputs"]["segments"]
    assert len(expected) == 2
    r = httpx.post(f"{server.url}/v1/infer", files={"audio": (path.name, path.read_bytes())}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["segments"] == expected
    for fmt in ("ipod", "webm", "adts"):  # M4A, WebM/Opus, raw AAC: the same speech, the same segments
        r = httpx.post(f"{server.url}/v1/infer", files={"audio": (f"talk.{fmt}", encode_av(speech, fmt))}, timeout=60)
        assert r.status_code == 200, (fmt, r.text)
        assert _close(_ms(r.json()["outputs"]["segments"]), _ms(expected)), (fmt, r.json(), expected)


def test_json_base64_m4a_matches_the_wav_segments(server: Server, speech: np.ndarray) -> None:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, speech, RATE, format="WAV", subtype="FLOAT")
    ref = httpx.post(f"{server.url}/v1/infer", files={"audio": ("t.wav", buf.getvalue())}, timeout=60).json()
    b64 = base64.b64encode(encode_av(speech, "ipod")).decode()
    r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"audio": {"b64": b64}}}, timeout=60)
    assert r.status_code == 200, r.text
    assert _close(_ms(r.json()["outputs"]["segments"]), _ms(ref["outputs"]["segments"])), (r.json(), ref)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:geventhttpclient.*")  # third-party noise
@pytest.mark.filterwarnings("ignore::DeprecationWarning:gevent.*")
def test_tritonclient_sends_an_mp3_as_a_bytes_tensor(server: Server, speech: np.ndarray) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    data = encode_av(speech, "mp3")
    client = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60.0)
    try:
        meta = client.get_model_metadata("speech-segments")
        assert meta["inputs"][0]["name"] == "audio" and meta["inputs"][0]["datatype"] == "BYTES"
        audio = th.InferInput("audio", [1], "BYTES")
        audio.set_data_from_numpy(np.array([data], dtype=object))  # binary tensor data
        result = client.infer("speech-segments", [audio])
        segments = [json.loads(x) for x in result.as_numpy("segments")]
        v1 = httpx.post(f"{server.url}/v1/infer", files={"audio": ("t.mp3", data)}, timeout=60).json()
        assert segments == v1["outputs"]["segments"] and len(segments) == 2

        bad = th.InferInput("audio", [1], "BYTES")
        bad.set_data_from_numpy(np.array([data[: len(data) // 2]], dtype=object))
        with pytest.raises(InferenceServerException, match=r"audio: \d+ bytes is truncated") as info:
            client.infer("speech-segments", [bad])
        assert info.value.status() == "400"
    finally:
        client.close()

    # the v2 JSON form: BYTES data as base64 text
    body = {"inputs": [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(data).decode()]}]}
    r = httpx.post(f"{server.url}/v2/models/speech-segments/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert [json.loads(x) for x in out["segments"]["data"]] == segments


def test_too_long_compressed_audio_is_a_413_before_decoding(server: Server) -> None:
    # 601 s of silence at 8 kHz (half the encoding work of 16 kHz): a small file declared too long
    data = encode_av(np.zeros(8000 * 601, np.float32), "mp3", rate=8000, codec_rate=8000)
    r = httpx.post(f"{server.url}/v1/infer", files={"audio": ("long.mp3", data)}, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["field"] == "audio"
    assert "the container declares 601.0 s of audio, above the input's limit of 600 s" in r.json()["message"]
