"""Turn raw request inputs into the values nodes consume, by modality, with clear errors.

Input limits come from the graph's top-level ``limits:`` (read with :func:`graph_limit`, so a
mapping or an object with attributes both work): ``max_image_pixels``, ``max_aspect_ratio``,
``image_formats`` (a list for every image input, or ``{INPUT: [FORMAT, ...]}``) and
``max_text_chars``; each is checked before the costly step (decoding, tokenizing). Audio inputs
carry their own ``sample_rate`` / ``channels`` / ``max_seconds`` (the length is read from the header).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from usg.errors import InputError, PayloadTooLarge
from usg.graph.model import Graph
from usg.ops.audio import decode_audio
from usg.ops.image import (
    DEFAULT_IMAGE_FORMATS,
    DEFAULT_MAX_ASPECT_RATIO,
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageLimits,
    decode_image,
)
from usg.specs import Modality

__all__ = ["DEFAULT_MAX_TEXT_CHARS", "graph_limit", "normalize_inputs"]

DEFAULT_MAX_TEXT_CHARS = 20_000  # tokenizing 20k CJK characters takes ~0.1-0.4 s on one core


def graph_limit(limits: Any, key: str, default: Any) -> Any:
    """``limits.KEY`` of a graph (a mapping or an object with attributes), or ``default`` when unset."""
    if limits is None:
        return default
    value = limits.get(key) if isinstance(limits, Mapping) else getattr(limits, key, None)
    return default if value is None else value


def _image_limits(graph: Graph, name: str) -> ImageLimits:
    formats: Any = graph_limit(graph.limits, "image_formats", None)
    if isinstance(formats, Mapping):
        formats = formats.get(name)
    return ImageLimits(
        max_pixels=int(graph_limit(graph.limits, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)),
        max_aspect_ratio=float(graph_limit(graph.limits, "max_aspect_ratio", DEFAULT_MAX_ASPECT_RATIO)),
        formats=tuple(str(f).upper() for f in formats) if formats else DEFAULT_IMAGE_FORMATS,
    )


def _tensor(name: str, d: Any, value: Any) -> Any:
    if d.spec is not None:
        if not isinstance(value, np.ndarray):
            raise InputError(
                f"{name}: expected an array ({d.spec.describe()}), got {type(value).__name__}",
                field=name,
                fix="pass a numpy array",
            )
        problems = d.spec.check(value)
        if problems:
            raise InputError(
                f"{name}: {value.dtype.name}{list(value.shape)} does not match "
                f"{d.spec.describe()}: {'; '.join(problems)}",
                field=name,
                fix=f"pass an array of {d.spec.describe()}",
            )
    return value


def normalize_inputs(graph: Graph, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Validate names and presence, decode images and audio, check tensor specs; absent inputs are left out."""
    unknown = sorted(set(raw) - set(graph.inputs))
    if unknown:
        raise InputError(
            f"unknown input(s) {', '.join(map(repr, unknown))} for graph {graph.name!r}",
            field=unknown[0],
            fix=f"use the graph's inputs: {', '.join(sorted(graph.inputs))}",
        )
    max_chars = int(graph_limit(graph.limits, "max_text_chars", DEFAULT_MAX_TEXT_CHARS))
    values: dict[str, Any] = {}
    for name, d in graph.inputs.items():
        value = raw.get(name)
        if value is None:
            if not d.optional:
                raise InputError(
                    f"required input {name!r} ({d.modality.value}) is missing",
                    field=name,
                    fix=f"pass {name}=... (declare optional: true in the graph to allow leaving it out)",
                )
            continue
        if d.modality is Modality.IMAGE:
            values[name] = decode_image(value, field=name, limits=_image_limits(graph, name))
        elif d.modality is Modality.TEXT:
            values[name] = _text(name, value, max_chars)
        elif d.modality is Modality.AUDIO:
            values[name] = decode_audio(value, field=name, spec=d.audio)
        else:
            values[name] = _tensor(name, d, value)
    if not values:
        present = ", ".join(f"{n} ({d.modality.value})" for n, d in graph.inputs.items())
        raise InputError("no inputs given", field=None, fix=f"pass at least one of: {present}")
    return values


def _text(name: str, value: Any, limit: int) -> str:
    """A text input as a str within ``limits.max_text_chars``, checked before decoding it."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) > 4 * limit:  # UTF-8 has at most 4 bytes a character: surely too long
            raise _too_long(name, len(value), limit, "bytes")
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{name}: text is not valid UTF-8", field=name, fix="send UTF-8 text") from None
    if not isinstance(value, str):
        raise InputError(f"{name}: expected text, got {type(value).__name__}", field=name, fix="pass a string")
    if len(value) > limit:
        raise _too_long(name, len(value), limit, "characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{name}: text has an unpaired surrogate {value[exc.start]!r} at position {exc.start}",
            field=name,
            fix="send valid Unicode text (a surrogate pair, or the character itself)",
        ) from None
    return value


def _too_long(name: str, size: int, limit: int, unit: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"input {name!r} has {size} {unit}, above the graph's limit of {limit} characters (limits.max_text_chars)",
        field=name,
        fix="send a shorter text (split a long document), or raise limits.max_text_chars in the graph",
    )
