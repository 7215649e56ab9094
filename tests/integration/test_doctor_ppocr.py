"""`usg doctor` on the real PP-OCRv4 models shipped in rapidocr_onnxruntime."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from usg.cli import cli
from usg.doctor import Severity, run_doctor

spec = importlib.util.find_spec("rapidocr_onnxruntime")
if spec is None or spec.origin is None:
    pytest.skip("rapidocr_onnxruntime (usg[ocr]) is not installed", allow_module_level=True)
MODELS = Path(spec.origin).parent / "models"
DET = MODELS / "ch_PP-OCRv4_det_infer.onnx"
REC = MODELS / "ch_PP-OCRv4_rec_infer.onnx"
CLS = MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_real_models_have_no_errors() -> None:
    report = run_doctor([DET, REC, CLS], targets="ort=1.20,tensorrt=10.3")
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert errors == []
    assert [t.kind for t in report.targets] == ["onnx"] * 3


DET_CONFIG = """
name: "det"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "sigmoid_0.tmp_0" data_type: TYPE_FP32 dims: [ 1, -1, -1 ] }} ]
dynamic_batching {{ }}
"""


def _repo(tmp_path: Path, dims: str) -> Path:
    d = tmp_path / "repo" / "det"
    (d / "1").mkdir(parents=True)
    shutil.copy(DET, d / "1" / "model.onnx")
    (d / "config.pbtxt").write_text(DET_CONFIG.format(dims=dims))
    return tmp_path / "repo"


def test_real_model_in_a_triton_repository(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "3, -1, -1")
    assert [f for f in run_doctor([repo]).findings if f.severity is Severity.ERROR] == []


def test_real_model_with_batch_dim_inside_dims(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "-1, 3, -1, -1")
    result = CliRunner().invoke(cli, ["doctor", str(repo), "--format", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    found = [f for f in doc["findings"] if f["code"] == "TRITON024"]
    assert len(found) == 1
    assert found[0]["evidence"]["model_shape"] == [-1, 3, -1, -1]
    assert found[0]["evidence"]["config_dims"] == [-1, 3, -1, -1]
    assert found[0]["location"]["line"] == 5


def test_cli_on_the_models_directory() -> None:
    result = CliRunner().invoke(cli, ["doctor", str(MODELS), "--target", "ort=1.20,tensorrt=10.3"])
    assert result.exit_code == 0, result.output
    assert "3 target(s) checked" in result.output
    assert "Root-cause matrix" in result.output and "0 error(s)" in result.output
