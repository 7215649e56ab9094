"""A log file read line by line in bounded memory: text checks first, long lines cut on the way in.

``usg doctor logs`` used to read the whole file and decode it at once: memory about 5–7× the log
(bytes, text, the list of lines), so a 2 GB server log needed more than 10 GB. :class:`LogReader`
reads fixed-size chunks, splits them where ``str.splitlines`` would split the decoded text, and cuts
a line longer than :data:`MAX_LINE_CHARS` to its two ends while it is still being read, so one
50 MB line costs two 4096-character ends, not 50 MB. A file that is not text (NUL bytes, or mostly
undecodable in its first 64 KiB) is a :class:`~usg.errors.UsageError`, not "no findings".
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import BinaryIO

from usg.errors import UsageError

__all__ = ["CHUNK_BYTES", "MAX_LINE_CHARS", "LogReader", "bounded"]

MAX_LINE_CHARS = 8192  # the longest line of the labelled corpus has ~1000 characters
CHUNK_BYTES = 1 << 20
_SNIFF_BYTES = 65536
_HALF = MAX_LINE_CHARS // 2


def bounded(line: str, cut: int = 0) -> str:
    """``line`` cut to its first and last ``MAX_LINE_CHARS / 2`` characters (``cut`` more were dropped before
    it got here); a line within the limit comes back as it is."""
    if len(line) <= MAX_LINE_CHARS and not cut:
        return line
    return f"{line[:_HALF]} [... {len(line) - 2 * _HALF + cut} characters cut ...] {line[-_HALF:]}"


class LogReader:
    """The lines of a binary log stream, as ``data.decode("utf-8", errors="replace").splitlines()`` gives them
    with each line passed through :func:`bounded`, read :data:`CHUNK_BYTES` at a time.

    ``bytes_read`` counts what has been read so far (for a progress bar against the file's size).
    """

    def __init__(self, fh: BinaryIO, name: str) -> None:
        self._fh = fh
        self.name = name
        self.bytes_read = 0

    def __iter__(self) -> Iterator[str]:
        head = self._read(_SNIFF_BYTES)
        _check_text(head, self.name)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""  # the line being read (for an over-long line: its last _HALF characters so far)
        long_head: str | None = None  # the first _HALF characters of an over-long line being read
        dropped = 0  # characters of that line dropped between its head and `pending`
        data = head
        while True:
            final = not data
            pending += decoder.decode(data, final=final)
            parts = pending.splitlines(keepends=True)
            pending = ""
            if parts and not final:
                last = parts[-1]
                # a line with no end yet, or one ending in "\r" whose "\n" may be in the next chunk
                if not _ends_line(last) or last.endswith("\r"):
                    pending = parts.pop()
            for part in parts:
                line = part.splitlines()[0] if part else part
                if long_head is not None:
                    yield bounded(long_head + line, dropped)
                    long_head, dropped = None, 0
                else:
                    yield bounded(line)
            if final:
                if long_head is not None:  # cannot happen: the last part closed it
                    yield bounded(long_head + pending, dropped)
                return
            if len(pending) > 2 * MAX_LINE_CHARS:  # no line end in sight: keep the head once, then a tail
                if long_head is None:
                    long_head, pending = pending[:_HALF], pending[_HALF:]
                dropped += len(pending) - _HALF
                pending = pending[-_HALF:]
            data = self._read(CHUNK_BYTES)

    def _read(self, size: int) -> bytes:
        data = self._fh.read(size)
        self.bytes_read += len(data)
        return data


def _ends_line(part: str) -> bool:
    return len(part.splitlines()[0]) < len(part)


def _check_text(head: bytes, name: str) -> None:
    if b"\x00" in head:
        raise UsageError(
            f"{name} is not a text log: it contains NUL bytes (binary data, e.g. a model or an archive); "
            "fix: give the server's or the exporter's text log (e.g. docker logs <container> > server.log)"
        )
    # a multi-byte character cut at the end of the sample is not counted as undecodable
    sample = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)
    if sample and sample.count("\ufffd") > 0.1 * len(sample):
        raise UsageError(
            f"{name} is not a UTF-8 text log ({sample.count(chr(0xFFFD))} undecodable characters in the first "
            f"{len(sample)}); fix: give the text log, or convert it first (iconv -f <encoding> -t utf-8)"
        )
