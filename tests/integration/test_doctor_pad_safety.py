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


def test_rec_behind_the_detector_is_reached_and_its_pad_claim_checked(tmp_path):
    # before: the dry run's sample image (a plain dark bar) gave PP-OCRv4 det no text line, so crops/cls/rec ran on
    # an empty list, rec's pad claim was never tested and the dry run "passed"
    from usg.graph import load_graph

    load_graph(EXAMPLE, export_missing=True)  # MiniLM is exported on first use
    text = EXAMPLE.read_text()
    rec_batch = "    batch: {max_size: 8, max_delay_ms: 3}\n"
    assert rec_batch in text
    g = tmp_path / "graph.yaml"
    padded = "    batch: {max_size: 8, max_delay_ms: 3, pad: {axes: [3], multiple: 32}}\n"
    g.write_text(text.replace(rec_batch, padded, 1))
    (finding,) = [f for f in run_doctor([g], dry_run=True).findings if f.code == "GRAPH023"]
    assert finding.evidence["model"] == "rec" and finding.evidence["drift"]["softmax_11.tmp_0"] > 1e-3
