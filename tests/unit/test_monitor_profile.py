"""``usg profile``: files → requests, deterministic output, graph and model digests, CLI errors."""

from __future__ import annotations

import hashlib
import json
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")

from click.testing import CliRunner
from PIL import Image

from usg.cli import cli
from usg.errors import UsageError
from usg.graph import load_graph
from usg.monitor.profile import build_profile, collect_requests, load_profile

MONITOR = Path(__file__).resolve().parents[1] / "resources" / "monitor"
sys.path.insert(0, str(MONITOR))


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (30 + i, 40, 3), dtype=np.uint8)).save(folder / f"doc{i}.png")
        (folder / f"doc{i}.txt").write_text(f"total due {i}")
    (folder / "more.jsonl").write_text("\n".join(json.dumps({"text": f"line {i} of text"}) for i in range(20)))
    (folder / "README.md").write_text("ignored: not a sample input")
    return folder


def test_files_group_into_requests_by_stem(inputs: Path) -> None:
    reqs = collect_requests(load_graph(MONITOR / "graph.yaml"), inputs)
    assert len(reqs) == 24
    doc0 = next(r for r in reqs if r.name == "doc0")
    assert set(doc0.raw) == {"image", "text"} and doc0.meta["image"]["format"] == "png"


def test_profile_is_deterministic_and_versioned(inputs: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        res = runner.invoke(
            cli,
            ["profile", str(MONITOR / "graph.yaml"), "--inputs", str(inputs), "-o", str(out)],
            standalone_mode=False,
        )
        assert res.exception is None, res.output
    assert outs[0].read_bytes() == outs[1].read_bytes()
    doc = load_profile(outs[0])
    graph_file = MONITOR / "graph.yaml"
    assert doc["graph"]["sha256"] == hashlib.sha256(graph_file.read_bytes()).hexdigest()
    assert doc["graph"]["models"]["scorer"] == {"backend": "python", "callable": "monitor_ops:scale"}
    assert doc["count"] == 24 and doc["presence"] == {"image": pytest.approx(4 / 24), "text": 1.0}
    image = doc["inputs"]["image"]
    assert set(image["numeric"]) == {"width", "height", "aspect", "brightness", "contrast", "channels"}
    assert image["categorical"] == {"format": {"png": 4}}
    assert {"characters", "tokens", "script_latin"} <= set(doc["inputs"]["text"]["numeric"])
    emb = doc["outputs"]["embedding"]
    assert emb["kind"] == "embedding" and emb["dim"] == 16 and len(emb["sample"]) == 24
    assert doc["outputs"]["score"]["histogram"]["edges"][0] == 0.0 and doc["outputs"]["score"]["count"] == 24


def test_model_files_are_hashed(tmp_path: Path) -> None:
    from usg.monitor.profile import graph_digests

    model = tmp_path / "tok.json"
    model.write_text('{"not": "really a tokenizer"}')
    graph_path = tmp_path / "g.yaml"
    graph_path.write_text(
        "name: g\ninputs: {text: {modality: text}}\nmodels: {tok: {backend: tokenizer, path: tok.json}}\n"
        "nodes: {t: {model: tok, inputs: {text: inputs.text}}}\noutputs: {ids: t.input_ids}\n"
    )
    digests = graph_digests(load_graph(graph_path))
    assert digests["models"]["tok"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()


def test_wav_files_feed_audio_inputs(tmp_path: Path) -> None:
    folder = tmp_path / "audio"
    folder.mkdir()
    with wave.open(str(folder / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((np.sin(np.arange(8000) / 10) * 16000).astype(np.int16).tobytes())
    graph_path = tmp_path / "g.yaml"
    graph_path.write_text(
        "name: g\ninputs: {audio: {modality: audio}}\n"
        "nodes: {i: {fn: 'testops:identity', inputs: {x: inputs.audio}}}\noutputs: {y: i.y}\n"
    )
    doc = build_profile(load_graph(graph_path), folder)
    audio = doc["inputs"]["audio"]["numeric"]
    assert audio["sample_rate"]["mean"] == 8000 and audio["seconds"]["mean"] == 1.0
    assert audio["rms"]["mean"] == pytest.approx(16000 / 32767 / np.sqrt(2), rel=0.02)


def test_bad_folders_and_files_say_the_fix(tmp_path: Path) -> None:
    graph = load_graph(MONITOR / "graph.yaml")
    with pytest.raises(UsageError, match=r"holds no sample inputs; fix: add images"):
        collect_requests(graph, tmp_path)
    (tmp_path / "x.wav").write_bytes(b"")
    with pytest.raises(UsageError, match=r"has no audio input; fix: remove the file"):
        collect_requests(graph, tmp_path)
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(UsageError, match=r"is not a USG profile .*fix: use `usg profile`"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(UsageError, match=r"does not exist; fix: create it with `usg profile"):
        load_profile(tmp_path / "nope.json")
