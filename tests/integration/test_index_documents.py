"""usg index / usg search on real rendered document images through the real document graph
(PP-OCRv4 + MiniLM): a query for a line's text returns that line of that document first."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

if importlib.util.find_spec("faiss") is None:
    pytest.skip("usg[index] (faiss-cpu) is not installed", allow_module_level=True)

from usg.cli import cli
from usg.graph import load_graph
from usg.index import DocumentIndex, EncoderMismatch, Searcher, build_index, scan_inputs
from usg.index.encoder import LineEncoder, query_graph
from usg.runtime import Executor
from usg.testing.documents import Line, render_document

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "examples" / "document_ocr" / "graph.yaml"

DOCS = {
    "invoice.png": ["Invoice number 55012", "Total due EUR 401.40", "Payment within thirty days"],
    "shipping.png": ["Shipping address", "42 Baker Street London", "Tracking code QX93020"],
    "minutes.png": ["Board meeting minutes", "The budget was approved", "Next meeting on Friday"],
}


def squash(text: str) -> str:
    return "".join(text.split()).lower()


@pytest.fixture(scope="module")
def graph():
    return load_graph(GRAPH, export_missing=True)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pages")
    for name, lines in DOCS.items():
        Image.fromarray(render_document([Line(t, size=28) for t in lines])).save(folder / name)
    (folder / "notes.txt").write_text("Remember to water the plants\n\nCall the plumber about the leak\n")
    return folder


@pytest.fixture(scope="module")
def index(graph, pages: Path, tmp_path_factory: pytest.TempPathFactory) -> DocumentIndex:
    files, skipped = scan_inputs([pages])
    assert skipped == []
    seen: list[tuple[str, int]] = []
    out = tmp_path_factory.mktemp("idx") / "index"
    idx = build_index(graph, files, out, collection="scans", progress=lambda d, n: seen.append((d, n)))
    assert [d for d, _ in seen] == ["invoice.png", "minutes.png", "notes.txt", "shipping.png"]
    assert dict(seen)["notes.txt"] == 2 and dict(seen)["invoice.png"] == 3
    return idx


@pytest.fixture(scope="module")
def query(graph, index: DocumentIndex):
    searcher = Searcher(index, graph)
    ex = Executor(query_graph(graph, searcher.chain))
    ex.start_sync()

    def run(text: str, k: int = 5):
        return searcher.search_text_sync(ex, text, k=k)

    yield run
    ex.close()


@pytest.mark.parametrize(("doc", "line"), [(d, i) for d in DOCS for i in range(3)])
def test_a_lines_text_finds_that_line_of_that_document_first(query, doc: str, line: int) -> None:
    hits = query(DOCS[doc][line])
    top = hits[0]
    assert top.document == doc, hits
    assert squash(top.text) == squash(DOCS[doc][line])  # the OCR'd line (PP-OCR may drop spaces)
    assert top.box is not None and len(top.box) == 4
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_boxes_are_the_ocr_boxes_and_entries_keep_the_inputs_sha256(graph, index: DocumentIndex, pages: Path) -> None:
    shard = index.shards["scans"]
    rec = shard.documents["shipping.png"]
    import hashlib

    assert rec.sha256 == hashlib.sha256((pages / "shipping.png").read_bytes()).hexdigest()
    assert rec.kind == "image"
    with Executor(graph) as ex:
        ocr = ex.infer_sync({"image": pages / "shipping.png"}).outputs["lines"]
    stored = [shard.entries[k] for k in rec.line_keys]
    assert [t for _, t, _ in stored] == [ln["text"] for ln in ocr]
    assert [b for _, _, b in stored] == [ln["box"] for ln in ocr]
    txt = shard.documents["notes.txt"]
    assert [shard.entries[k][1:] for k in txt.line_keys] == [
        ("Remember to water the plants", None),
        ("Call the plumber about the leak", None),
    ]


def test_txt_lines_and_semantic_queries(query) -> None:
    assert query("plumbing problem")[0].document == "notes.txt"
    assert query("how much money is owed")[0].document == "invoice.png"


def test_index_records_the_encoder_and_refuses_another(graph, index: DocumentIndex) -> None:
    head = index.manifest["head"]
    assert head["kind"] == "identity" and head["out_dim"] == 384  # 14 lines: too few for a 128-d head
    enc = LineEncoder(graph)
    try:
        vec = enc.encode(["Tracking code"])
        assert index.search(vec[0], encoder_digest=enc.digest, k=1)[0].document == "shipping.png"
        with pytest.raises(EncoderMismatch, match=r"not comparable; fix: query with the graph the index was built"):
            index.search(vec[0], encoder_digest="0" * 64, k=1)
    finally:
        enc.close()


def test_cli_build_add_remove_search(pages: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(pages / "invoice.png", src / "invoice.png")
    (src / "todo.txt").write_text("Order more printer paper\n")
    out = tmp_path / "idx"
    r = runner.invoke(cli, ["index", "build", str(src), "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "indexed 2 document(s), 4 lines" in r.output and "too few to learn a 128-d head" in r.output
    r = runner.invoke(cli, ["index", "build", str(src), "-o", str(out)])
    assert r.exit_code != 0 and "exists and is not empty; fix: pass --force" in str(r.exception)
    shutil.copy(pages / "minutes.png", src / "minutes.png")
    r = runner.invoke(cli, ["index", "add", str(out), str(src)], catch_exceptions=False)
    assert "1 added, 0 replaced (changed), 2 unchanged; 3 lines indexed" in r.output, r.output
    r = runner.invoke(cli, ["search", str(out), "the budget was approved", "-k", "2", "--json"], catch_exceptions=False)
    body = json.loads(r.output)
    assert body["results"][0]["document"] == "minutes.png" and len(body["results"]) == 2
    assert body["results"][0]["collection"] == "src"
    r = runner.invoke(cli, ["index", "remove", str(out), "minutes.png"], catch_exceptions=False)
    assert "removed 1 document(s) from 'src'" in r.output
    r = runner.invoke(cli, ["search", str(out), "the budget was approved", "--json"], catch_exceptions=False)
    assert {h["document"] for h in json.loads(r.output)["results"]} == {"invoice.png", "todo.txt"}
    r = runner.invoke(
        cli, ["search", str(out), "--image", str(pages / "invoice.png"), "--json"], catch_exceptions=False
    )
    body = json.loads(r.output)
    assert body["results"][0] == {**body["results"][0], "document": "invoice.png", "kind": "page"}
    assert any("55012" in t for t in body["image_lines"])


def test_blank_pages_only_is_a_clear_error(graph, tmp_path: Path) -> None:
    Image.fromarray(np.full((200, 300, 3), 255, np.uint8)).save(tmp_path / "blank.png")
    files, _ = scan_inputs([tmp_path])
    from usg.errors import UsageError

    with pytest.raises(UsageError, match=r"no lines were read from the inputs .*fix: index documents with text"):
        build_index(graph, files, tmp_path / "idx", collection="x")


def test_cli_build_with_a_head_re_ranks_with_residual_codes(tmp_path: Path) -> None:
    """A 16-d head over real MiniLM embeddings keeps residual codes by default, records them in the
    manifest, and finds the exact line with a score close to the exact cosine (``--no-refine``:
    tests/unit/test_index_residual.py)."""
    import inspect
    import json as json_mod
    import sys

    src = tmp_path / "src"
    src.mkdir()
    # real sentences, no two alike: docstring lines of the standard library
    lines = [ln.strip() for ln in (inspect.getdoc(json_mod) or "").splitlines() if len(ln.split()) >= 3][:30]
    lines += [f"{name} is a module of the Python standard library" for name in sorted(sys.stdlib_module_names)][:30]
    (src / "lines.txt").write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    out = tmp_path / "idx"
    r = runner.invoke(cli, ["index", "build", str(src), "-o", str(out), "--dim", "16"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "re-ranked by 192 B of residual code" in r.output
    head = json.loads((out / "manifest.json").read_text())["head"]
    assert head["kind"] == "pca" and head["out_dim"] == 16
    assert head["residual"] == {"components": 368, "bits": "8x16+4x352", "bytes_per_vector": 192}
    r = runner.invoke(cli, ["search", str(out), lines[7], "-k", "1", "--json"], catch_exceptions=False)
    hit = json.loads(r.output)["results"][0]
    assert hit["text"] == lines[7]
    assert hit["score"] == pytest.approx(1.0, abs=0.02)  # re-ranked: close to the exact cosine


def test_unreadable_documents_are_skipped_and_listed_not_the_whole_build_lost(tmp_path: Path) -> None:
    """One bad file in a folder of scans used to stop `usg index build` after all the OCR before it;
    it is now left out and listed with its reason (--strict: the old stop at the first)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("Total due EUR 401.40\nPayment within thirty days\n")
    (src / "latin1.txt").write_bytes("Straße über alles\n".encode("latin-1"))
    (src / "trunc.png").write_bytes((ROOT / "examples" / "document_ocr" / "sample.png").read_bytes()[:100])
    runner = CliRunner()
    out = tmp_path / "idx"
    r = runner.invoke(cli, ["index", "build", str(src), "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 1, r.output  # written, but not everything asked for is in it
    text = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert "skipped latin1.txt: " in text and "is not UTF-8 text" in text
    assert "skipped trunc.png: " in text and "truncated or corrupt PNG" in text
    assert "indexed 1 document(s), 2 lines" in text and "2 document(s) could not be read" in text
    assert sorted(DocumentIndex.open(out).shards["src"].documents) == ["a.txt"]

    r = runner.invoke(cli, ["index", "build", str(src), "-o", str(tmp_path / "strict"), "--strict"])
    assert r.exit_code != 0 and "latin1.txt is not UTF-8 text" in str(r.exception)
    assert not (tmp_path / "strict" / "manifest.json").exists()

    (src / "a.txt").write_bytes(b"\xff\xfe changed, and now unreadable\n")  # a changed version that cannot be read
    (src / "b.txt").write_text("Board meeting minutes\n")
    r = runner.invoke(cli, ["index", "add", str(out), str(src / "a.txt"), str(src / "b.txt")], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "1 added, 0 replaced (changed), 0 unchanged; 1 lines indexed" in text
    assert "skipped a.txt: " in text
    docs = DocumentIndex.open(out).shards["src"].documents
    assert sorted(docs) == ["a.txt", "b.txt"]  # the old a.txt stays indexed
