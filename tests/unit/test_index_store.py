"""usg.index on small synthetic embeddings: store, head, shards, add/remove, encoder-digest refusal, bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("faiss") is None:
    pytest.skip("usg[index] (faiss-cpu) is not installed", allow_module_level=True)

from usg.errors import InputError, UsageError
from usg.index.build import remove_documents, scan_inputs
from usg.index.head import Head, fit_head
from usg.index.shard import Shard
from usg.index.store import DocumentIndex, EncoderMismatch
from usg.index.vectors import VectorSet

DIGEST = "a" * 64
D = 32


def unit_rows(n: int, d: int = D, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_index(tmp_path: Path, head: Head, docs: dict[str, np.ndarray], collection: str = "c") -> DocumentIndex:
    idx = DocumentIndex.create(
        tmp_path / "idx", head=head, encoder_digest=DIGEST, encoder_path="enc.onnx", graph_path=None
    )
    shard = idx.shard(collection, create=True)
    for doc, emb in docs.items():
        texts = [f"{doc} line {i}" for i in range(len(emb))]
        boxes = [[[0.0, float(i)], [10.0, float(i)], [10.0, i + 1.0], [0.0, i + 1.0]] for i in range(len(emb))]
        page = emb.mean(0)
        shard.add_document(
            doc, "f" * 64, "image", texts, boxes, head.apply(emb), head.apply(page), head.codes(emb), head.codes(page)
        )
    idx.save()
    return idx


def test_pca_head_is_orthonormal_and_keeps_inner_products_of_low_rank_data() -> None:
    rng = np.random.default_rng(1)
    low = rng.normal(size=(500, 8)) @ rng.normal(size=(8, D))  # rank 8 in 32-d
    x = low.astype(np.float32)
    head = fit_head(x, 8)
    assert head.kind == "pca" and head.matrix is not None and head.matrix.shape == (D, 8)
    np.testing.assert_allclose(head.matrix.T @ head.matrix, np.eye(8), atol=1e-4)
    y = head.apply(x)
    np.testing.assert_allclose(y @ y.T, x @ x.T, rtol=1e-3, atol=1e-2)
    assert head.explained > 0.999


def test_identity_head_and_head_round_trip(tmp_path: Path) -> None:
    x = unit_rows(50)
    ident = fit_head(x, D)
    assert ident.kind == "identity" and ident.matrix is None
    np.testing.assert_array_equal(ident.apply(x), x)
    head = fit_head(x, 4)
    head.save(tmp_path / "h.npz")
    back = Head.load(tmp_path / "h.npz")
    assert back.digest == head.digest and back.digest != ident.digest
    np.testing.assert_array_equal(back.apply(x), head.apply(x))


def test_head_bad_dims_say_the_fix() -> None:
    x = unit_rows(10)
    with pytest.raises(UsageError, match=r"--dim 16: a 16-d head is learned .* only 10; fix: index at least 16"):
        fit_head(x, 16)
    with pytest.raises(UsageError, match=r"--dim 40: the encoder emits 32-d embeddings; fix: pass --dim between"):
        fit_head(x, 40)
    with pytest.raises(InputError, match=r"head for 32-d encoder output"):
        fit_head(x, 4).apply(np.zeros((1, 7), np.float32))


def test_search_returns_the_line_itself_first_with_text_box_and_score(tmp_path: Path) -> None:
    docs = {"a.png": unit_rows(40, seed=2), "b.png": unit_rows(40, seed=3)}
    idx = make_index(tmp_path, fit_head(np.concatenate(list(docs.values())), 16), docs)
    hits = idx.search(docs["b.png"][7], encoder_digest=DIGEST, k=5)
    assert len(hits) == 5
    top = hits[0]
    assert (top.document, top.text, top.kind, top.collection) == ("b.png", "b.png line 7", "line", "c")
    assert top.box == [[0.0, 7.0], [10.0, 7.0], [10.0, 8.0], [0.0, 8.0]]
    assert top.score == pytest.approx(max(h.score for h in hits))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    pages = idx.search(docs["a.png"].mean(0), encoder_digest=DIGEST, k=2, pages=True)
    assert [p.document for p in pages] == ["a.png", "b.png"] and pages[0].kind == "page"


def test_index_reopens_from_disk_with_the_same_answers(tmp_path: Path) -> None:
    docs = {"a.txt": unit_rows(30, seed=4)}
    idx = make_index(tmp_path, fit_head(docs["a.txt"], 8), docs)
    before = idx.search(docs["a.txt"][3], encoder_digest=DIGEST, k=3)
    again = DocumentIndex.open(tmp_path / "idx")
    assert again.search(docs["a.txt"][3], encoder_digest=DIGEST, k=3) == before
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["encoder"]["sha256"] == DIGEST
    assert manifest["head"]["kind"] == "pca" and manifest["head"]["out_dim"] == 8
    assert manifest["head"]["residual"] == {"components": 24, "bits": "8x8+4x16", "bytes_per_vector": 16}
    assert manifest["collections"] == ["c"] and manifest["library"].startswith("faiss-cpu")


def test_query_from_another_encoder_is_refused(tmp_path: Path) -> None:
    docs = {"a.txt": unit_rows(20)}
    idx = make_index(tmp_path, fit_head(docs["a.txt"], D), docs)
    with pytest.raises(
        EncoderMismatch, match=r"encoder sha256 bbbbbbbbbbbb.*built with encoder sha256 aaaa.*fix:"
    ) as e:
        idx.search(docs["a.txt"][0], encoder_digest="b" * 64)
    assert e.value.status == 409


def test_shards_per_collection_are_searched_together_and_separately(tmp_path: Path) -> None:
    head = Head("identity", D, D)
    idx = make_index(tmp_path, head, {"x.txt": unit_rows(10, seed=5)}, collection="one")
    other = unit_rows(10, seed=6)
    idx.shard("two", create=True).add_document(
        "y.txt", "0" * 64, "text", [f"y{i}" for i in range(10)], [None] * 10, other, None
    )
    idx.save()
    idx = DocumentIndex.open(tmp_path / "idx")
    assert sorted(idx.shards) == ["one", "two"]
    assert (tmp_path / "idx" / "shards" / "two" / "lines.vectors.npz").is_file()
    assert idx.search(other[2], encoder_digest=DIGEST, k=1)[0].text == "y2"
    only_one = idx.search(other[2], encoder_digest=DIGEST, k=3, collections=["one"])
    assert {h.collection for h in only_one} == {"one"}
    with pytest.raises(UsageError, match=r"no collection 'nope'; fix: use one of \['one', 'two'\]"):
        idx.search(other[2], encoder_digest=DIGEST, collections=["nope"])
    with pytest.raises(UsageError, match=r"collection name '../x' is not allowed"):
        idx.shard("../x", create=True)
    with pytest.raises(UsageError, match=r"collection name 'one\\n' is not allowed"):  # `$` matched before a newline
        idx.shard("one\n", create=True)


def test_replace_and_remove_documents(tmp_path: Path) -> None:
    a, b = unit_rows(10, seed=7), unit_rows(10, seed=8)
    idx = make_index(tmp_path, Head("identity", D, D), {"a.png": a, "b.png": b})
    shard = idx.shards["c"]
    assert len(shard) == 20 and len(shard.lines) == 20
    new_a = unit_rows(3, seed=9)
    shard.add_document("a.png", "e" * 64, "image", ["n0", "n1", "n2"], [None] * 3, new_a, None)
    assert len(shard) == 13 and len(shard.lines) == 13 and shard.documents["a.png"].sha256 == "e" * 64
    texts = {h.text for h in idx.search(a[4], encoder_digest=DIGEST, k=13)}
    assert texts == {"n0", "n1", "n2"} | {f"b.png line {i}" for i in range(10)}  # old lines of a.png are gone
    with pytest.raises(UsageError, match=r"no document\(s\) \['zz.png'\]; fix: use ids as indexed") as exc:
        remove_documents(idx, ["zz.png"], collection="c")
    assert "(`usg index info INDEX --documents` lists them)" in str(exc.value)  # without --documents it does not
    # the id as `usg search` prints it (COLLECTION/ID): the message says what to drop
    with pytest.raises(UsageError, match=r"fix: drop the collection prefix `usg search` prints \('b.png'\)"):
        remove_documents(idx, ["c/b.png"], collection="c")
    remove_documents(idx, ["b.png"], collection="c")
    again = DocumentIndex.open(tmp_path / "idx")
    assert sorted(again.shards["c"].documents) == ["a.png"]
    assert {h.document for h in again.search(b[0], encoder_digest=DIGEST, k=3)} == {"a.png"}
    remove_documents(again, ["a.png"], collection="c")  # the last one: the collection goes too
    assert DocumentIndex.open(tmp_path / "idx").shards == {}
    assert not (tmp_path / "idx" / "shards" / "c").exists()


def test_bad_inputs_have_clear_errors(tmp_path: Path) -> None:
    idx = make_index(tmp_path, Head("identity", D, D), {"a.txt": unit_rows(5)})
    with pytest.raises(InputError, match=r"k=0 is out of range; fix: ask for 1 to 1000"):
        idx.search(unit_rows(1)[0], encoder_digest=DIGEST, k=0)
    with pytest.raises(InputError, match=r"head for 32-d encoder output"):
        idx.search(np.zeros(5, np.float32), encoder_digest=DIGEST)
    with pytest.raises(UsageError, match=r"is not a usg index \(no manifest.json\); fix: build one"):
        DocumentIndex.open(tmp_path / "nothing")
    (tmp_path / "idx" / "shards" / "c" / "lines.vectors.npz").unlink()
    with pytest.raises(InputError, match=r"lines.vectors.npz is missing; fix: the shard is damaged"):
        DocumentIndex.open(tmp_path / "idx")
    vs = VectorSet(4)
    with pytest.raises(InputError, match=r"vectors of shape \[2, 3\], this index holds 4-d"):
        vs.add(np.arange(2), np.zeros((2, 3)))
    with pytest.raises(InputError, match=r"NaN or inf"):
        vs.add(np.arange(1), np.full((1, 4), np.nan))
    shard = Shard("s", 4)
    with pytest.raises(InputError, match=r"2 lines, 1 boxes, 2 vectors"):
        shard.add_document("d", "0", "text", ["a", "b"], [None], np.ones((2, 4)), None)


def test_empty_shard_search_and_scan_inputs(tmp_path: Path) -> None:
    vs = VectorSet(4)
    keys, scores = vs.search(np.ones(4, np.float32), 3)
    assert keys.tolist() == [[-1, -1, -1]] and np.isneginf(scores).all()
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("hello\n")
    (tmp_path / "d" / "sub" / "p.PNG").write_bytes(b"not really")
    (tmp_path / "d" / "notes.md").write_text("x")
    files, skipped = scan_inputs([tmp_path / "d"])
    assert [(f.doc_id, f.kind) for f in files] == [("a.txt", "text"), ("sub/p.PNG", "image")]
    assert files[0].sha256 == "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert skipped == [str(tmp_path / "d" / "notes.md")]
    with pytest.raises(UsageError, match=r"does not exist; fix: pass a folder"):
        scan_inputs([tmp_path / "missing"])


def _damage(folder: Path, how: str) -> None:
    manifest = folder / "manifest.json"
    m = json.loads(manifest.read_text())
    lines = folder / "shards" / "c" / "lines.vectors.npz"
    meta = folder / "shards" / "c" / "meta.json"
    if how == "manifest-a-list":
        manifest.write_text("[1, 2]")
    elif how == "dim-huge":
        manifest.write_text(json.dumps(m | {"dim": 10**12}))
    elif how == "dim-a-string":
        manifest.write_text(json.dumps(m | {"dim": "32"}))
    elif how == "collection-outside":
        manifest.write_text(json.dumps(m | {"collections": ["../../outside"]}))
    elif how == "collections-a-string":
        manifest.write_text(json.dumps(m | {"collections": "c"}))
    elif how == "head-missing":
        (folder / "head.npz").unlink()
    elif how == "head-garbage":
        (folder / "head.npz").write_bytes(b"garbage")
    elif how == "vectors-truncated":
        lines.write_bytes(lines.read_bytes()[:20])
    elif how == "vectors-declare-1tib":  # an .npy member whose header declares 1 TiB over 16 bytes
        import io
        import zipfile

        with zipfile.ZipFile(lines) as z:
            members = {n: z.read(n) for n in z.namelist()}
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 38,)})
        members["keys.npy"] = header.getvalue() + b"\0" * 16
        with zipfile.ZipFile(lines, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
    elif how == "meta-a-list":
        meta.write_text("[1]")
    elif how == "meta-short-line":
        meta.write_text(json.dumps(json.loads(meta.read_text()) | {"lines": [[1, 2]]}))


@pytest.mark.parametrize(
    ("how", "error", "match"),
    [
        ("manifest-a-list", UsageError, r"index format 'a JSON list'"),
        ("dim-huge", UsageError, r"manifest.json: dim is 1000000000000, not a vector width in 1\.\.65536; fix"),
        ("dim-a-string", UsageError, r"dim is '32', not a vector width"),
        ("collection-outside", UsageError, r"collections holds '\.\./\.\./outside', not a collection name"),
        ("collections-a-string", UsageError, r"collections is 'c', not a list"),
        ("head-missing", UsageError, r"head\.npz: not a usg index head \(FileNotFoundError"),
        ("head-garbage", UsageError, r"head\.npz: not a usg index head .*fix: the index folder is damaged"),
        ("vectors-truncated", InputError, r"lines\.vectors\.npz: not a vector set \(BadZipFile"),
        ("vectors-declare-1tib", InputError, r"lines\.vectors\.npz: not a vector set \(MemoryError"),
        ("meta-a-list", InputError, r"meta\.json does not hold a shard \(TypeError"),
        ("meta-short-line", InputError, r"meta\.json does not hold a shard \(ValueError"),
    ],
)
def test_a_damaged_index_folder_is_a_clear_error_never_a_crash(tmp_path: Path, how: str, error: type, match: str):
    """Each was an internal error (AttributeError, faiss's own exception, FileNotFoundError, BadZipFile,
    TypeError); a collection name from the manifest led outside the index and into an `rm -r` fix."""
    make_index(tmp_path, Head("identity", D, D), {"doc": unit_rows(3)})
    _damage(tmp_path / "idx", how)
    with pytest.raises(error, match=match) as info:
        DocumentIndex.open(tmp_path / "idx")
    assert type(info.value) is error
    assert "rm -r" not in str(info.value) or "outside" not in str(info.value)


def test_long_text_lines_are_indexed_in_pieces_cut_at_spaces() -> None:
    from usg.index.build import MAX_LINE_CHARS, line_pieces

    assert line_pieces("") == [] and line_pieces("total due") == ["total due"]
    words = " ".join(f"w{i:04d}" for i in range(1000))  # 5999 characters
    pieces = line_pieces(words)
    assert all(0 < len(p) <= MAX_LINE_CHARS for p in pieces) and " ".join(pieces) == words
    assert all(not p.startswith(" ") and not p.endswith(" ") for p in pieces)
    solid = "x" * (2 * MAX_LINE_CHARS + 5)  # no space: cut mid-word
    assert [len(p) for p in line_pieces(solid)] == [MAX_LINE_CHARS, MAX_LINE_CHARS, 5]


@pytest.mark.timeout(20)  # a hang guard, not a timing assert: cutting copied the rest each time (66 s here)
def test_a_32_mb_line_is_cut_in_one_pass() -> None:
    from usg.index.build import MAX_LINE_CHARS, line_pieces

    words = " ".join(f"w{i:07d}" for i in range(32 * 2**20 // 9))
    pieces = line_pieces(words)
    assert all(0 < len(p) <= MAX_LINE_CHARS for p in pieces)
    assert sum(map(len, pieces)) + len(pieces) - 1 == len(words)
    assert pieces[0] == words[: len(pieces[0])] and pieces[-1] == words[-len(pieces[-1]) :]
