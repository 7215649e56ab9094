"""Turn raw request inputs into the values nodes consume, by modality, with clear errors.

Input limits come from the graph's top-level ``limits:`` (read with :func:`graph_limit`, so a
mapping or an object with attributes both work): ``max_image_pixels``, ``max_aspect_ratio``,
``image_formats`` (a list for every image input, or ``{INPUT: [FORMAT, ...]}``) and
``max_text_chars``; each is checked before the costly step (decoding, tokenizing). Audio inputs
carry their own ``sample_rate`` / ``channels`` / ``max_seconds`` (the length is read from the header).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    probe_image,
)
from usg.specs import Modality

__all__ = ["DEFAULT_MAX_TEXT_CHARS", "Undecoded", "decode_pending", "graph_limit", "image_limits", "normalize_inputs"]

DEFAULT_MAX_TEXT_CHARS = 20_000  # tokenizing 20k CJK characters takes ~0.1-0.4 s on one core


def graph_limit(limits: Any, key: str, default: Any) -> Any:
    """``limits.KEY`` of a graph (a mapping or an object with attributes), or ``default`` when unset."""
    if limits is None:
        return default
    value = limits.get(key) if isinstance(limits, Mapping) else getattr(limits, key, None)
    return default if value is None else value


def image_limits(graph: Graph, name: str) -> ImageLimits:
    """The limits an image input is decoded under (the graph's ``limits:``)."""
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


@dataclass(frozen=True)
class Undecoded:
    """An image input whose header passed every limit, its pixels not decoded yet (a node-cache
    hit may not need them); :func:`decode_pending` decodes it."""

    value: Any


def decode_pending(graph: Graph, values: dict[str, Any], names: Iterable[str]) -> None:
    """Decode the :class:`Undecoded` inputs among ``names`` in place."""
    for name in names:
        pending = values.get(name)
        if isinstance(pending, Undecoded):
            values[name] = decode_image(pending.value, field=name, limits=image_limits(graph, name))


def normalize_inputs(graph: Graph, raw: Mapping[str, Any], *, defer_images: bool = False) -> dict[str, Any]:
    """Validate names and presence, decode images and audio, check tensor specs; absent inputs are left out.

    ``defer_images``: encoded images (bytes, paths) are checked from their header only (format,
    pixels, aspect ratio) and left :class:`Undecoded`."""
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
        if d.timestamped:
            values[name] = _timestamped(graph, d, value, max_chars)
        elif d.modality is Modality.IMAGE and defer_images and not isinstance(value, np.ndarray):
            probe_image(value, field=name, limits=image_limits(graph, name))
            values[name] = Undecoded(value)
        else:
            values[name] = _decode_one(graph, d, name, value, max_chars)
    if not values:
        present = ", ".join(f"{n} ({d.modality.value})" for n, d in graph.inputs.items())
        raise InputError("no inputs given", field=None, fix=f"pass at least one of: {present}")
    return values


def _decode_one(graph: Graph, d: Any, name: str, value: Any, max_chars: int) -> Any:
    if d.modality is Modality.IMAGE:
        return decode_image(value, field=name, limits=image_limits(graph, name))
    if d.modality is Modality.TEXT:
        return _text(name, value, max_chars)
    if d.modality is Modality.AUDIO:
        return decode_audio(value, field=name, spec=d.audio)
    return _tensor(name, d, value)


#: the key of a timestamped item's value, by modality (``value`` is accepted for every modality)
ITEM_KEYS = {Modality.IMAGE: "image", Modality.AUDIO: "audio", Modality.TEXT: "text", Modality.TENSOR: "value"}


def _timestamped(graph: Graph, d: Any, value: Any, max_chars: int) -> list[dict[str, Any]]:
    """``[{image|value: ..., ts_ms: N}, ...]`` → decoded items ``{image: ..., ts_ms: float}`` (count checked first)."""
    key = ITEM_KEYS[d.modality]
    fix = f'send a list of {{"{key}": ..., "ts_ms": MS}} items (ts_ms: capture time in milliseconds)'
    if not isinstance(value, (list, tuple)):
        raise InputError(
            f"{d.name}: expected a list of timestamped items, got {type(value).__name__}", field=d.name, fix=fix
        )
    if len(value) > d.max_items:
        raise PayloadTooLarge(
            f"input {d.name!r} has {len(value)} items, above its limit of {d.max_items} (max_items)",
            field=d.name,
            fix=f"send at most {d.max_items} items, or raise max_items on the input in the graph",
        )
    out = []
    for i, item in enumerate(value):
        where = f"{d.name}[{i}]"
        ts = item.get("ts_ms") if isinstance(item, Mapping) else None
        raw = item.get(key, item.get("value")) if isinstance(item, Mapping) else None
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not np.isfinite(ts) or raw is None:
            raise InputError(f"{where}: item is not {{{key!r}: ..., 'ts_ms': NUMBER}}", field=d.name, fix=fix)
        out.append({key: _decode_one(graph, d, where, raw, max_chars), "ts_ms": float(ts)})
    return out


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
