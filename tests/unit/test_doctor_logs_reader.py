"""`usg doctor logs` reads a log a chunk at a time: the same lines as decoding it whole, in bounded memory."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import usg.doctor.logs.reader as reader
from usg.doctor.logs.classify import classify_lines, classify_text
from usg.doctor.logs.reader import LogReader, bounded
from usg.errors import UsageError


def _whole(data: bytes) -> list[str]:
    return [bounded(line) for line in data.decode("utf-8", errors="replace").splitlines()]


def _read(data: bytes) -> list[str]:
    return list(LogReader(io.BytesIO(data), "test.log"))


# pieces that stress the chunk borders: every line break str.splitlines knows, "\r\n" split in two, multi-byte
# characters (cut in two at a border), an invalid byte, long runs without a break
_PIECES = st.sampled_from(
    [
        *(b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", "\u0085".encode(), "\u2028".encode()),
        *("é".encode(), "€".encode(), "😀".encode(), b"\xff"),
        *(b"ERROR x", b" ", b"a" * 7, b"b" * 300),
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_PIECES, max_size=60), chunk=st.integers(1, 9), sniff=st.integers(1, 9))
def test_lines_are_those_of_the_whole_file_whatever_the_chunk_borders(
    pieces: list[bytes], chunk: int, sniff: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"".join(pieces)
    with monkeypatch.context() as m:
        m.setattr(reader, "CHUNK_BYTES", chunk)
        m.setattr(reader, "_SNIFF_BYTES", sniff)
        m.setattr(reader, "MAX_LINE_CHARS", 1 << 30)  # no line cut here: only the splitting is compared
        m.setattr(reader, "_check_text", lambda head, name: None)  # a 1-byte sniff would refuse "\xff"
        assert _read(data) == data.decode("utf-8", errors="replace").splitlines()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=6),
    filler=st.sampled_from(["x", "é", "€", "😀", "ab "]),
    chunk=st.integers(1, 64),
)
def test_a_long_line_is_cut_as_if_it_had_been_read_whole(
    sizes: list[int], filler: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = "\n".join(f"{i}:" + filler * n + ":end" for i, n in enumerate(sizes)).encode()
    with monkeypatch.context() as m:
        m.setattr(reader, "CHUNK_BYTES", chunk)
        m.setattr(reader, "_SNIFF_BYTES", chunk)
        m.setattr(reader, "MAX_LINE_CHARS", 16)
        m.setattr(reader, "_HALF", 8)
        m.setattr(reader, "_check_text", lambda head, name: None)
        assert _read(data) == _whole(data)


def test_a_huge_line_is_held_by_its_ends_only() -> None:
    """A 30 MB line without a break: what the reader holds at any time stays near one chunk."""
    held: list[int] = []

    class Source(io.RawIOBase):
        def __init__(self) -> None:
            self.left = 30 * reader.CHUNK_BYTES

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            n = min(size, self.left)
            self.left -= n
            if self.left or not n:
                return b"x=" * (n // 2) + b"x" * (n % 2)
            return b"x" * (n - 12) + b" done: ERROR"

    lines = iter(LogReader(Source(), "big.log"))  # type: ignore[arg-type]
    (line,) = list(lines)
    held.append(len(line))
    assert line.startswith("x=x=") and line.endswith(" done: ERROR")
    assert f"[... {30 * reader.CHUNK_BYTES - reader.MAX_LINE_CHARS} characters cut ...]" in line
    assert held[0] < reader.MAX_LINE_CHARS + 60


def test_classify_lines_reads_a_long_log_once_and_holds_few_lines() -> None:
    read = 0
    biggest_gap = 0

    def lines() -> Iterator[str]:
        nonlocal read
        for i in range(60_000):
            read += 1
            yield f"2026-12-06 12:00:00 INFO step {i} ok"
        yield "Traceback (most recent call last):"
        for i in range(3_000):  # a deep recursion's frames
            yield f'  File "model.py", line {i}, in forward'
            yield "    return self.forward(x)"
        yield "RecursionError: maximum recursion depth exceeded"
        yield "2026-12-06 12:00:01 ERROR RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"

    seen: list[tuple[int, int | None]] = []

    def progress(done: int, total: int | None) -> None:
        nonlocal biggest_gap
        biggest_gap = max(biggest_gap, read - done)
        seen.append((done, total))

    findings = classify_lines(lines(), learned=False, progress=progress)
    assert "LOG012" in [f.code for f in findings]
    assert biggest_gap < 10  # lines are read as the events need them, not all first
    assert seen[-1] == (66_003, 66_003) and all(total is None for _, total in seen[:-1])


def test_repeats_keep_a_count_and_their_first_lines_only() -> None:
    text = "\n".join(["RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"] * 5000)
    (f,) = classify_text(text, learned=False)
    assert f.evidence["count"] == 5000 and f.evidence["lines"] == list(range(1, 21))


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x00\x01model" * 100, "contains NUL bytes"),
        (bytes(range(128, 256)) * 100, "is not a UTF-8 text log"),
    ],
)
def test_a_binary_file_is_refused_before_it_is_read_through(data: bytes, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        _read(data)
