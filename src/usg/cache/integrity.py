"""Integrity digests: the SHA-256 of every graph input as received, checked against a client's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from usg.cache.key import input_digest
from usg.errors import InputError
from usg.graph.model import Graph

__all__ = ["check_expected", "digest_inputs"]

_HEX = re.compile(r"^[0-9a-f]{64}$")


def digest_inputs(graph: Graph, raw: Mapping[str, Any]) -> dict[str, str]:
    """Hex SHA-256 of each given graph input (absent ones are left out)."""
    return {n: input_digest(graph.inputs[n], v) for n, v in raw.items() if v is not None and n in graph.inputs}


def check_expected(digests: Mapping[str, str], expected: Mapping[str, str] | None) -> None:
    """Raise :class:`InputError` (400) when a client's expected digest differs from the received one."""
    for name, want in (expected or {}).items():
        text = str(want).strip().lower()
        text = text.removeprefix("sha256:")
        if not _HEX.match(text):
            raise InputError(
                f"input {name!r}: expected sha256 {want!r} is not 64 hex digits",
                field=name,
                fix='send "sha256:<64 hex digits>" (or the bare hex digest) of the input\'s bytes',
            )
        got = digests.get(name)
        if got is None:
            raise InputError(
                f"input {name!r}: a sha256 was sent for it, but the input itself was not",
                field=name,
                fix=f"send input {name!r}, or drop its expected digest",
            )
        if got != text:
            raise InputError(
                f"input {name!r}: integrity check failed: received bytes have sha256:{got}, "
                f"the client expected sha256:{text}",
                field=name,
                fix="resend the input (it changed in transit), or send the digest of the exact bytes you send",
            )
