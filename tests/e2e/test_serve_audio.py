"""A real ``usg serve`` of the speech-segments example: multipart and JSON base64 audio, 400 and 413."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

sf = pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

from harness import ROOT, USG, Server  # noqa: E402

EXAMPLE = ROOT / "examples" / "speech_segments"


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("talk") / "talk.wav"
    subprocess.run([sys.executable, str(EXAMPLE / "make_sample.py"), str(out)], check=True, capture_output=True)
    return out


def test_speech_segments_over_http_match_usg_run(serve: Callable[..., Server], talk: Path) -> None:
    cli = subprocess.run(
        [str(USG), "run", str(EXAMPLE / "graph.yaml"), "-i", f"audio={talk}", "--json"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    expected = json.loads(cli.stdout)["outputs"]
    assert len(expected["segments"]) == 2
    server = serve(EXAMPLE / "graph.yaml")
    data = talk.read_bytes()
    r = httpx.post(f"{server.url}/v1/infer", files={"audio": ("talk.wav", data, "audio/wav")}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == expected
    b64 = base64.b64encode(data).decode()
    r = httpx.post(f"{server.url}/v1/infer", json={"inputs": {"audio": {"b64": b64}}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == expected

    r = httpx.post(f"{server.url}/v1/infer", files={"audio": ("t.wav", data[: len(data) // 2], "audio/wav")})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "audio" and "truncated" in r.json()["message"]

    buf = io.BytesIO()  # 601 s of silence: a small FLAC whose header says it is above max_seconds (600)
    sf.write(buf, np.zeros(16_000 * 601, np.float32), 16_000, format="FLAC")
    r = httpx.post(f"{server.url}/v1/infer", files={"audio": ("long.flac", buf.getvalue(), "audio/flac")})
    assert r.status_code == 413, r.text
    assert "audio is 601.0 s long, above the input's limit of 600 s" in r.json()["message"]
