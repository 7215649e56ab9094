"""GRAPH023: a model declared pad-safe is checked by padding a real item further during --dry-run."""

from pathlib import Path

from usg.doctor import run_doctor

EXAMPLE = Path(__file__).parents[2] / "examples" / "document_ocr" / "graph.yaml"

BAD = """
name: padded-rec
inputs:
  image: {modality: image}
models:
  rec:
    path: pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx
    batch: {max_size: 8, max_delay_ms: 3, pad: {axes: {x: [3]}, multiple: 32}}
nodes:
  pre: {fn: "usg.ops.image:to_nchw_float", inputs: {image: inputs.image}}
  resize: {fn: "testops:to_rec", inputs: {x: pre.x}}
  rec: {model: rec, inputs: {x: resize.x}}
outputs: {probs: rec.out}
"""


def codes(report):
    return [f.code for f in report.findings]


def test_rec_declared_pad_safe_is_caught_with_the_drift(tmp_path):
    g = tmp_path / "padded.yaml"
    g.write_text(BAD)
    report = run_doctor([g], dry_run=True)
    (finding,) = [f for f in report.findings if f.code == "GRAPH023"]
    assert finding.severity.value == "error" and finding.stage.value == "dry_run"
    assert finding.evidence["model"] == "rec"
    assert finding.evidence["drift"]["softmax_11.tmp_0"] > 1e-3
    assert finding.location.element == "models.rec.batch.pad" and finding.location.line == 8
    assert "remove models.rec.batch.pad" in finding.fix
    # without --dry-run the claim is not tested
    assert "GRAPH023" not in codes(run_doctor([g]))


def test_example_graph_padding_claim_holds():
    from usg.graph import load_graph

    load_graph(EXAMPLE, export_missing=True)  # MiniLM is exported on first use
    report = run_doctor([EXAMPLE], dry_run=True)
    assert "GRAPH023" not in codes(report)
    assert not [f for f in report.findings if f.severity.value == "error"]
