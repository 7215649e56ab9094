"""--inputs of usg bench / quantize / tune: a file in the folder that cannot be read as what its
suffix says is a usage error naming it (before: UnicodeDecodeError, UnidentifiedImageError or
DecompressionBombError shown as "internal error", after the graph's models had loaded)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from usg.bench.samples import load_samples
from usg.errors import UsageError


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _bomb_png() -> bytes:
    """A ~60-byte PNG whose header declares 60000 x 60000 pixels."""
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("notes.txt", "café".encode("latin-1"), r"'.*notes\.txt' is not UTF-8 text \(byte 0xe9 at offset 3\)"),
        ("page.png", b"\x89PNG\r\n\x1a\ntruncated", r"'.*page\.png' is not a readable image"),
        ("bomb.png", _bomb_png(), r"'.*bomb\.png' is not a readable image \(Image size \(3600000000 pixels\)"),
    ],
)
def test_an_unreadable_input_file_is_a_usage_error_naming_it(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    Image.new("RGB", (8, 8), "white").save(tmp_path / "ok.png")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UsageError, match=match) as exc:
        load_samples(tmp_path)
    assert "fix: " in str(exc.value) and "take it out of the folder" in str(exc.value)


def test_readable_inputs_still_load(tmp_path: Path) -> None:
    Image.new("RGB", (8, 6), "white").save(tmp_path / "a.png")
    (tmp_path / "t.txt").write_text("one\n\ntwo\n")
    samples = load_samples(tmp_path)
    assert [(s.name, s.image.shape if s.image is not None else None, s.text) for s in samples] == [
        ("a", (6, 8, 3), "one")
    ]


def test_a_missing_inputs_path_says_leave_it_out_only_where_there_is_a_default(tmp_path):
    # usg quantize requires --inputs: its message said "pass images/texts or leave it out"
    with pytest.raises(UsageError, match=r"no such file or folder; fix: pass a folder or file of images") as exc:
        load_samples(tmp_path / "nope", required=True)
    assert "leave" not in str(exc.value)
    with pytest.raises(UsageError, match=r"or leave --inputs out"):
        load_samples(tmp_path / "nope")
