"""Read an input file given by path (``usg run -i image=PATH``) within a bound when it is not a regular file."""

from __future__ import annotations

from pathlib import Path

from usg.errors import PayloadTooLarge

__all__ = ["STREAM_LIMIT_BYTES", "read_input_file"]

#: most bytes read from a path that is not a regular file (/dev/stdin, a FIFO; /dev/zero never ends)
STREAM_LIMIT_BYTES = 256 * 1024 * 1024


def read_input_file(path: Path, field: str) -> bytes:
    """The bytes of ``path``: a regular file whole, anything else (a pipe, a device) up to the bound."""
    if path.is_file():
        return path.read_bytes()
    with path.open("rb") as fh:
        data = fh.read(STREAM_LIMIT_BYTES + 1)
    if len(data) > STREAM_LIMIT_BYTES:
        raise PayloadTooLarge(
            f"{field}: {str(path)!r} is not a regular file and gave more than {STREAM_LIMIT_BYTES // 2**20} MiB "
            "without ending (a device such as /dev/zero?)",
            field=field,
            fix="pass a file, or pipe the file's bytes (e.g. /dev/stdin) rather than an endless stream",
        )
    return data
