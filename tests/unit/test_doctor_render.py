"""Renderers: every format carries the root-cause matrix; SARIF validates against the 2.1.0 schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from usg.doctor import Finding, Location, RootCause, Severity, Stage, render, root_cause_matrix

SCHEMA = Path(__file__).parents[1] / "resources" / "doctor" / "sarif-schema-2.1.0.json"

FINDINGS = [
    Finding(
        "TRITON023",
        Severity.ERROR,
        RootCause.BATCH_DIM_CONFIG,
        "max_batch_size is 8 but 'x' is fixed",
        Location("repo/det/config.pbtxt", "input x", 4, 3),
        "set max_batch_size: 0",
        {"max_batch_size": 8, "model_shape": [1, 3, 640, 640]},
    ),
    Finding(
        "ONNX011",
        Severity.WARNING,
        RootCause.OP_SEMANTIC_DRIFT,
        "Resize <asymmetric> & drift",
        Location("models/det.onnx", "up"),
        "re-export",
        {"mode": "linear"},
    ),
    Finding(
        "LOG004",
        Severity.ERROR,
        RootCause.BATCH_DIM_CONFIG,
        "batch dim mismatch in server log",
        Location("triton.log", None, 120),
        "set max_batch_size: 0",
        {"line": "..."},
        Stage.LOGS,
    ),
    Finding(
        "PARITY001",
        Severity.WARNING,
        RootCause.OP_SEMANTIC_DRIFT,
        "max abs diff 0.2",
        Location("model.onnx"),
        "check Resize",
        {"max_abs_diff": 0.2},
        Stage.PARITY,
    ),
]


def test_matrix_counts_worst_severity_and_stages() -> None:
    rows = {r.root_cause: r for r in root_cause_matrix(FINDINGS)}
    assert len(rows) == len(RootCause)
    batch = rows[RootCause.BATCH_DIM_CONFIG]
    assert (batch.count, batch.worst, batch.stages) == (2, Severity.ERROR, [Stage.STATIC, Stage.LOGS])
    drift = rows[RootCause.OP_SEMANTIC_DRIFT]
    assert (drift.count, drift.worst, drift.stages) == (2, Severity.WARNING, [Stage.STATIC, Stage.PARITY])
    assert rows[RootCause.MEMORY].count == 0 and rows[RootCause.MEMORY].worst is None


def test_json_report() -> None:
    doc = json.loads(render(FINDINGS, "json"))
    assert doc["summary"]["error"] == 2 and doc["summary"]["warning"] == 2
    row = next(r for r in doc["root_cause_matrix"] if r["root_cause"] == "batch_dim_config")
    assert row == {
        "root_cause": "batch_dim_config",
        "count": 2,
        "worst_severity": "error",
        "stages": ["static", "logs"],
        "by_stage": {"static": 1, "dry_run": 0, "parity": 0, "logs": 1},
    }
    assert doc["findings"][0]["evidence"]["model_shape"] == [1, 3, 640, 640]
    assert doc["findings"][0]["location"] == {
        "file": "repo/det/config.pbtxt",
        "element": "input x",
        "line": 4,
        "column": 3,
    }


def test_text_report_shows_evidence_fix_and_matrix() -> None:
    text = render(FINDINGS, "text")
    assert "TRITON023" in text and "line 4:3" in text
    assert "evidence: max_batch_size=8  model_shape=[1,3,640,640]" in text
    assert "fix: set max_batch_size: 0" in text
    assert re.search(r"batch_dim_config\s+2\s+error\s+static \(1\), logs \(1\)", text)
    assert "2 error(s), 2 warning(s), 0 info" in text
    assert "\x1b[" not in text  # no colour unless asked


def test_html_is_self_contained_and_escaped() -> None:
    page = render(FINDINGS, "html")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "<link" not in page
    assert "Resize &lt;asymmetric&gt; &amp; drift" in page
    assert "Root-cause matrix" in page and "static (1), logs (1)" in page


def test_sarif_validates_against_the_official_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    doc = json.loads(render(FINDINGS, "sarif"))
    jsonschema.Draft4Validator(schema).validate(doc)
    run = doc["runs"][0]
    first = run["results"][0]
    assert first["ruleId"] == "TRITON023" and first["level"] == "error"
    assert run["tool"]["driver"]["rules"][first["ruleIndex"]]["id"] == "TRITON023"
    region = first["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 4, "startColumn": 3}
    assert first["properties"]["evidence"]["max_batch_size"] == 8
    assert {r["ruleId"] for r in run["results"]} == {"TRITON023", "ONNX011", "LOG004", "PARITY001"}
    assert run["results"][1]["level"] == "warning"
    assert any(
        r["root_cause"] == "batch_dim_config" and r["count"] == 2 for r in run["properties"]["root_cause_matrix"]
    )


def test_sarif_schema_rejects_a_broken_document() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    doc = json.loads(render(FINDINGS, "sarif"))
    doc["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(doc)


def test_empty_report_renders_in_every_format() -> None:
    for fmt in ("text", "json", "html", "sarif"):
        out = render([], fmt)
        assert "dtype_or_range" in out  # the matrix, even with nothing found


def test_sarif_of_a_real_run_validates(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from usg.doctor import run_doctor

    bad = tmp_path / "repo" / "m"
    (bad / "1").mkdir(parents=True)
    (bad / "config.pbtxt").write_text('name: "m"\nbackend: "python"\ninput [ { name: "a" data_type: TYPE_FP32 ')
    (bad / "1" / "model.py").write_text("")
    ok = tmp_path / "repo" / "n"
    (ok / "1").mkdir(parents=True)
    (ok / "config.pbtxt").write_text(
        'name: "n"\nbackend: "python"\nmax_batch_size: 0\ndynamic_batching { }\n'
        'input [ { name: "a" data_type: TYPE_FP32 dims: [ 0 ] } ]\n'
    )
    (ok / "1" / "model.py").write_text("")
    findings = run_doctor([tmp_path / "repo"]).findings
    doc = json.loads(render(findings, "sarif"))
    jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).validate(doc)
    by_rule = {r["ruleId"]: r for r in doc["runs"][0]["results"]}
    assert set(by_rule) >= {"TRITON001", "TRITON003", "TRITON006"}
    parse = by_rule["TRITON001"]["locations"][0]["physicalLocation"]
    assert parse["region"]["startLine"] == 3
    assert "end of file" in by_rule["TRITON001"]["message"]["text"]


def test_public_api_is_curated_and_sorted() -> None:
    import usg.doctor

    assert usg.doctor.__all__ == sorted(usg.doctor.__all__)
    for name in usg.doctor.__all__:
        assert getattr(usg.doctor, name) is not None
    assert {"Finding", "Severity", "RootCause", "Stage", "Location", "run_doctor", "render"} <= set(usg.doctor.__all__)
