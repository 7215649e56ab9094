import contextlib
import io
import os
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from usg.errors import InputError, PayloadTooLarge
from usg.ops.image import decode_image, to_nchw_float


def png_bytes(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (255, 255, 255)).save(buf, format="PNG")
    return buf.getvalue()


def test_decodes_paths_bytes_and_arrays(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(png_bytes(7, 5))
    assert decode_image(p).shape == (5, 7, 3)
    assert decode_image(png_bytes(3, 4)).dtype == np.uint8
    gray = np.zeros((4, 4), np.uint8)
    assert decode_image(gray).shape == (4, 4, 3)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match=r"image: file '.*nope.png' does not exist; fix: pass the path"):
        decode_image(tmp_path / "nope.png")
    with pytest.raises(InputError, match="is a directory"):
        decode_image(tmp_path)


def _fifo_fed(tmp_path: Path, data: bytes) -> Path:
    """A FIFO a thread writes ``data`` into (as a shell pipe feeds /dev/stdin)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), path.open("wb") as fh:  # the reader may stop at its bound
            fh.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return path


def test_an_image_piped_through_a_fifo_decodes(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (5, 4), "white").save(buf, format="PNG")
    assert decode_image(_fifo_fed(tmp_path, buf.getvalue())).shape == (4, 5, 3)


def test_a_stream_that_does_not_end_is_refused_at_the_bound(tmp_path, monkeypatch):
    # before: read whole (usg run -i image=/dev/zero: "internal error: MemoryError"); the bound is
    # 256 MiB, lowered here so the stream is small
    monkeypatch.setattr("usg.ops.files.STREAM_LIMIT_BYTES", 1024 * 1024)
    path = _fifo_fed(tmp_path, b"\0" * (2 * 1024 * 1024))
    with pytest.raises(PayloadTooLarge, match=r"image: '.*pipe' is not a regular file and gave more than 1 MiB"):
        decode_image(path)


def test_an_audio_stream_that_does_not_end_is_refused_at_the_bound(tmp_path, monkeypatch):
    from usg.ops.audio import decode_audio

    monkeypatch.setattr("usg.ops.files.STREAM_LIMIT_BYTES", 1024 * 1024)
    path = _fifo_fed(tmp_path, b"\0" * (2 * 1024 * 1024))
    with pytest.raises(PayloadTooLarge, match=r"audio: '.*pipe' is not a regular file and gave more than 1 MiB"):
        decode_audio(path)


def test_zero_byte_and_corrupt_bytes(tmp_path):
    p = tmp_path / "empty.png"
    p.write_bytes(b"")
    with pytest.raises(InputError, match=r"is empty \(0 bytes\)"):
        decode_image(p)
    with pytest.raises(InputError, match=r"is not a decodable image \(first bytes 6e6f7420616e2069\).*fix: send a PNG"):
        decode_image(b"not an image at all")
    truncated = png_bytes(50, 50)[:60]
    with pytest.raises(InputError, match=r"truncated or corrupt|not a decodable image"):
        decode_image(truncated)


def test_empty_array_and_wrong_dtype():
    with pytest.raises(InputError, match="image is 0x0"):
        decode_image(np.zeros((0, 0, 3), np.uint8))
    with pytest.raises(InputError, match=r"dtype float32, expected uint8; fix: convert with"):
        decode_image(np.zeros((4, 4, 3), np.float32))


def test_pixel_limit_is_checked_from_the_header_before_decoding():
    big = png_bytes(6000, 6000)  # 36 MP of white compresses to a few KB
    t0 = time.perf_counter()
    with pytest.raises(PayloadTooLarge, match=r"image is 6000x6000 = 36000000 pixels, above the limit of 1000000"):
        decode_image(big, max_pixels=1_000_000)
    # decoding 36 MP would take far longer than reading a header; generous bound, not a benchmark
    assert time.perf_counter() - t0 < 1.0
    assert PayloadTooLarge.status == 413


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header declares w x h and whose pixel data is a single row (a bomb's shape)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" + b"\x00" * 3 * w)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", row) + chunk(b"IEND", b"")


def test_a_header_pil_refuses_as_a_bomb_names_the_declared_pixels():
    # 60000x60000 is more than twice PIL's own bomb limit: Image.open refuses before our size check runs
    with pytest.raises(
        PayloadTooLarge,
        match=r"image: \d+ bytes declares 3600000000 pixels, above the limit of 40000000; fix: downscale",
    ):
        decode_image(_png_header_only(60000, 60000), max_pixels=40_000_000)


def test_empty_bytes_are_named_once():
    with pytest.raises(InputError, match=r"^image: the image is empty \(0 bytes\); fix: send the image's bytes$"):
        decode_image(b"")


def test_to_nchw_float():
    x = to_nchw_float(np.full((2, 3, 3), 255, np.uint8))["x"]
    assert x.shape == (1, 3, 2, 3) and x.dtype == np.float32 and float(x.max()) == 1.0
