""".npy tensor inputs (``usg run -i x=FILE.npy``, a /v1 multipart upload) are read header first: a
header declaring more bytes than follow, an object array or a file that is not .npy is an input
error naming it, before anything is allocated (np.load allocated what the header declared: a
128-byte upload declaring 74.5 GiB was a MemoryError)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from usg.cli import EXIT_FAILED, main
from usg.graph import GraphBuilder
from usg.npy import load_npy
from usg.serve import create_app
from usg.specs import TensorSpec


def forged(shape: str, descr: str = "<f8", tail: bytes = b"\0" * 64) -> bytes:
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)  # noqa: UP031
    header = header + " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + tail


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (forged("(10000000000,)"), r"declares shape \(10000000000,\) float64 \(80,000,000,000 bytes\) but only 64"),
        (npy(np.zeros((2, 2), np.float32))[:-3], r"\(16 bytes\) but only 13 bytes follow"),
        (b"PK\x03\x04rest of a zip", r"does not start like a \.npy file \(first bytes 504b0304"),
        (b"", r"first bytes nothing: the file is empty"),
        (forged("(2,)", descr="|O"), r"holds an object array"),
        (forged("(2,"), r"header does not parse"),
    ],
)
def test_load_npy_refuses_before_allocating(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_npy(data)


@pytest.mark.parametrize("order", ["C", "F"])
def test_load_npy_reads_what_np_save_wrote(tmp_path: Path, order: str) -> None:
    a = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)) if order == "F" else np.arange(6.0).reshape(2, 3)
    p = tmp_path / "a.npy"
    np.save(p, a)
    for got in (load_npy(p), load_npy(p.read_bytes())):
        assert got.dtype == a.dtype and np.array_equal(got, a) and got.flags.writeable


def test_usg_run_with_a_forged_npy_exits_1_naming_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "g.yaml").write_text(
        "inputs: {x: {modality: tensor, dtype: float32, shape: [2, 2]}}\n"
        "nodes:\n  n: {fn: 'testops:identity', inputs: {x: inputs.x}}\noutputs: {y: n.y}\n"
    )
    (tmp_path / "bomb.npy").write_bytes(forged("(10000000000,)"))
    with pytest.raises(SystemExit) as exc:  # before: "internal error: MemoryError: Unable to allocate 74.5 GiB"
        main(["run", str(tmp_path / "g.yaml"), "-i", f"x={tmp_path / 'bomb.npy'}"])
    err = capsys.readouterr().err
    assert exc.value.code == EXIT_FAILED and "x: " in err and "80,000,000,000 bytes) but only 64" in err, err


def test_a_forged_npy_upload_is_a_400_naming_the_field() -> None:
    graph = (
        GraphBuilder("t")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .node("n", fn="testops:identity", inputs={"x": "inputs.x"})
        .output("y", "n.y")
        .build()
    )
    with TestClient(create_app(graph)) as client:
        r = client.post("/v1/infer", files={"x": ("x.npy", forged("(10000000000,)"), "application/octet-stream")})
        assert r.status_code == 400, r.text  # before: a 500 (MemoryError)
        assert r.json()["field"] == "x" and "but only 64 bytes follow" in r.json()["message"]
        ok = client.post(
            "/v1/infer", files={"x": ("x.npy", npy(np.ones((1, 3), np.float32)), "application/octet-stream")}
        )
        assert ok.status_code == 200 and ok.json()["outputs"]["y"] == [[1.0, 1.0, 1.0]], ok.text
