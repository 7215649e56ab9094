"""Request decoding shared by ``/v1`` and ``/v2``: bounded JSON, base64 images, text fields.

JSON bodies are parsed with their hostile cases bounded: an integer longer than
:data:`MAX_INT_DIGITS` digits is refused while parsing (before Python builds it), nesting
deeper than the graph's ``limits.max_nesting_depth`` is refused (413), and parser
recursion can never escape as a 500.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from usg.errors import InputError, PayloadTooLarge, USGError

__all__ = [
    "DEFAULT_FIX",
    "MAX_INT_DIGITS",
    "b64_audio",
    "b64_image",
    "check_depth",
    "expected_digests",
    "load_json",
    "parsing",
    "safe_text",
]

log = logging.getLogger("usg.serve")

DEFAULT_FIX = 'send {"inputs": {"text": "...", "image": {"b64": "..."}}}'

MAX_INT_DIGITS = 20  # int64 / uint64 fit in 20 digits (with the sign); longer integers are refused


def safe_text(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes, so it can be UTF-8 encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(
            f"a JSON integer in the body has {len(digits.lstrip('-'))} digits, above the limit of {MAX_INT_DIGITS}",
            field="body",
            fix="send integers that fit in 64 bits (tensor data, shapes and sizes)",
        )
    return int(digits)


def _too_deep(limit: int, where: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{where} nests deeper than the limit of {limit} levels",
        field=where,
        fix="send flat data (a tensor as {data: [...], shape: [...]}), or raise limits.max_nesting_depth in the graph",
    )


def check_depth(doc: Any, limit: int, where: str = "body") -> None:
    """Refuse lists/objects nested deeper than ``limit`` (iterative: no recursion on hostile input)."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth >= limit:
                raise _too_deep(limit, where)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))


#: ``json.loads(text, parse_int=_bounded_int)`` builds a decoder per call; this one is built once
_DECODER = json.JSONDecoder(parse_int=_bounded_int)


def _loads(body: bytes | str) -> Any:
    """``json.loads(body, parse_int=_bounded_int)``, on the module's one decoder."""
    if isinstance(body, str):
        if body.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", body, 0)
    else:
        body = body.decode(json.detect_encoding(body), "surrogatepass")
    return _DECODER.decode(body)


def load_json(body: bytes, *, max_depth: int, what: str = "body", fix: str) -> Any:
    """Parse a JSON body within bounds; every failure is a 4xx :class:`InputError` naming ``what``."""
    try:
        doc = _loads(body)
    except RecursionError:
        raise _too_deep(max_depth, what) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{what} is not valid JSON ({exc})", field="body", fix=fix) from None
    except ValueError as exc:  # e.g. a float literal Python refuses
        raise InputError(f"{what} has a value JSON parsing refused ({exc})", field="body", fix=fix) from None
    check_depth(doc, max_depth, what)
    return doc


def b64_image(name: str, text: str) -> bytes:
    """Base64 text (a ``data:`` URL prefix is accepted) → the encoded image's bytes."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InputError(
            f"{name}: image is not valid base64 ({safe_text(str(exc))})",
            field=name,
            fix="send the encoded image (PNG/JPEG) base64-encoded, or upload it as a multipart file",
        ) from None


@contextlib.contextmanager
def parsing(what: str) -> Iterator[None]:
    """Decoding untrusted input: an unexpected exception is the input's fault (400), never a 500.

    The decoders raise :class:`InputError` for every case they know; this catches what a
    fuzzer finds beyond them, logs it (a decoder gap worth a precise message) and names the body.
    """
    try:
        yield
    except USGError:
        raise
    except RecursionError:
        raise InputError(f"{what} nests too deeply", field="body", fix="send flatter data") from None
    except Exception as exc:
        log.warning("%s could not be decoded", what, exc_info=True)
        raise InputError(
            f"{what} could not be decoded ({type(exc).__name__})",
            field="body",
            fix="check the request against the protocol (GET /openapi.json describes /v1)",
        ) from None


def expected_digests(items: Mapping[Any, Any]) -> dict[str, str]:
    """The ``sha256`` a client sent per input (``{NAME: {"sha256": "<hex>", ...}}``), checked to be text."""
    out: dict[str, str] = {}
    for name, value in items.items():
        if not isinstance(value, Mapping) or "sha256" not in value:
            continue
        digest = value["sha256"]
        if not isinstance(digest, str) or not isinstance(name, str):
            raise InputError(
                f"{name}: sha256 must be the input's hex digest as a string, got {type(digest).__name__}",
                field=str(name),
                fix='send "sha256": "<64 hex digits>" (or "sha256:<hex>")',
            )
        out[name] = digest
    return out


def b64_audio(name: str, text: str) -> bytes:
    """Base64 text (a ``data:`` URL prefix is accepted) → the encoded audio file's bytes."""
    try:
        return b64_image(name, text)
    except InputError:
        raise InputError(
            f"{name}: audio is not valid base64",
            field=name,
            fix="send the audio file (WAV/FLAC/OGG/MP3/M4A/...) base64-encoded, or upload it as a multipart file",
        ) from None
