"""Vision-token arithmetic of VLM families: what one image costs in a language model's context.

Shared by ``usg doctor`` (the coupling checks of :mod:`usg.doctor.hf.coupling`, the graph
budget check), ``usg plan`` and the ``backend: openai`` token budget (:class:`ImageTokens`
reads a model's HF configs and counts an image of a given size, or the worst case under a
pixel limit). Computed twice: as the model sees it and as the processor does.

Model side (what the vision tower + projector hand the language model per image):

* ViT patches ``(image_size / patch_size)²``, plus one CLS token for CLIP-style towers
  (``clip_vision_model``); SigLIP towers have no CLS.
* ``vision_feature_select_strategy``: ``"default"`` drops the first token (meant to be CLS),
  ``"full"`` keeps every token. On a SigLIP tower "default" drops a real patch.
* LLaVA-NeXT *anyres*: the base tile plus the unpadded grid of tiles chosen from
  ``image_grid_pinpoints``, plus one newline token per row.
* Qwen2-VL: patches are merged ``spatial_merge_size²`` to one token, on an image resized to a
  multiple of ``patch_size × merge_size`` within ``[min_pixels, max_pixels]``.
* Idefics3 / SmolVLM: pixel shuffle divides the patch count by ``scale_factor²``.

Processor side (what the processor expands the image placeholder into): LLaVA
``(crop / patch_size)² + num_additional_image_tokens - (1 if strategy == "default")``;
PaliGemma ``image_seq_length``; Qwen2-VL the same formula with the processor's own
``patch_size``/``merge_size``; Idefics3 ``image_seq_len``.

The formulas follow transformers' processors and modeling code (``LlavaProcessor``,
``LlavaNextProcessor._get_number_of_features``, ``smart_resize``) so the two sides agree exactly
when the configs agree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ImageTokens",
    "anyres_tokens",
    "fuyu_tokens",
    "has_cls",
    "image_tokens_from_configs",
    "load_image_tokens",
    "qwen2_vl_resize",
    "select_best_resolution",
    "vit_tokens",
]

_CLS_TOWERS = {"clip_vision_model", "clip", "openai_clip"}


def has_cls(vision_model_type: str | None) -> bool:
    """CLIP towers prepend a CLS token; SigLIP (and unknown towers we do not assume) do not."""
    return (vision_model_type or "") in _CLS_TOWERS


def vit_tokens(image_size: int, patch_size: int, cls: bool, strategy: str | None) -> int:
    """Tokens per image (one tile) after the select strategy."""
    n = (image_size // patch_size) ** 2 + (1 if cls else 0)
    return n - 1 if strategy == "default" else n


def select_best_resolution(size: tuple[int, int], pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """transformers' ``select_best_resolution``: the pinpoint keeping most pixels, then least waste."""
    h, w = size
    best: tuple[int, int] = (int(pinpoints[0][0]), int(pinpoints[0][1]))
    best_eff, best_waste = -1, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / w, ph / h)
        dw, dh = int(w * scale), int(h * scale)
        eff = min(dw * dh, w * h)
        waste = ph * pw - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (int(ph), int(pw)), eff, waste
    return best


def anyres_tokens(
    orig: tuple[int, int],
    tile: int,
    patch_size: int,
    pinpoints: Sequence[Sequence[int]],
    base_tokens: int,
) -> int:
    """LLaVA-NeXT tokens for an image of ``orig`` = (height, width): base tile + unpadded grid + newlines."""
    oh, ow = orig
    bh, bw = select_best_resolution(orig, pinpoints)
    scale_h, scale_w = bh // tile, bw // tile
    ph = pw = tile // patch_size
    cur_h, cur_w = ph * scale_h, pw * scale_w
    if ow / oh > cur_w / cur_h:
        new_h = int(round(oh * (cur_w / ow), 7))
        cur_h -= ((cur_h - new_h) // 2) * 2
    else:
        new_w = int(round(ow * (cur_h / oh), 7))
        cur_w -= ((cur_w - new_w) // 2) * 2
    return cur_h * cur_w + cur_h + base_tokens


def qwen2_vl_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' ``smart_resize`` for Qwen2-VL."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def fuyu_tokens(height: int, width: int, patch: tuple[int, int], target: tuple[int, int]) -> int:
    """Fuyu: the image is scaled down (never up) to fit ``target`` = (height, width); each row of
    ``patch`` patches of the unpadded part is followed by a newline token; then one ``<s>``."""
    scale = min(target[0] / height, target[1] / width)
    uh, uw = min(int(height * scale), height), min(int(width * scale), width)
    rows, cols = math.ceil(uh / patch[0]), math.ceil(uw / patch[1])
    return rows * (cols + 1) + 1


@dataclass(frozen=True)
class ImageTokens:
    """Prompt tokens one image takes for a VLM, from its HF configs.

    ``count(height, width)`` is exact for the family's processor; ``worst(max_pixels,
    max_aspect)`` is the most any image within those limits can take (``max_pixels=None``:
    any size), with the (height, width) that takes it.
    """

    family: str
    count_fn: Callable[[int, int], int]
    #: the family's own bound (e.g. Qwen2-VL max_pixels, the largest anyres pinpoint), any size
    cap: int
    #: a one-line account of the arithmetic, for messages
    rule: str
    #: pixels of the processor's resolution bound one token stands for (Qwen2-VL (patch·merge)²)
    pixels_per_token: int | None = None

    def count(self, height: int, width: int) -> int:
        return self.count_fn(int(height), int(width))

    def worst(self, max_pixels: int | None = None, max_aspect: float = 50.0) -> tuple[int, tuple[int, int] | None]:
        """The largest count over images of at most ``max_pixels`` pixels and aspect ratio
        ``max_aspect`` (each height tried with its widest width), bounded by :attr:`cap`."""
        if max_pixels is None or self.family in ("llava", "paligemma"):
            return self.cap, None
        lo = max(1, math.ceil(math.sqrt(max_pixels / max_aspect)))
        hi = max(lo, math.floor(math.sqrt(max_pixels * max_aspect)))
        best, at = 0, None
        for h in range(lo, hi + 1):
            w = min(max_pixels // h, math.floor(h * max_aspect))
            if w < 1 or max(h, w) / min(h, w) > max_aspect:
                continue
            n = self.count(h, w)
            if n > best:
                best, at = n, (h, w)
                if best >= self.cap:
                    break
        return min(best, self.cap), at


def _crop(pre: Mapping[str, Any]) -> int | None:
    for key in ("crop_size", "size"):
        v = pre.get(key)
        if isinstance(v, Mapping):
            for k in ("height", "shortest_edge", "width"):
                if isinstance(v.get(k), int):
                    return int(v[k])
        elif isinstance(v, int):
            return v
    return None


def _llava(config: Mapping[str, Any], proc: Mapping[str, Any], next_: bool) -> ImageTokens:
    v = dict(config.get("vision_config") or {})
    image, patch = int(v.get("image_size", 224)), int(v.get("patch_size", 14))
    cls = has_cls(v.get("model_type", "clip_vision_model"))
    strategy = config.get("vision_feature_select_strategy", "default")
    crop = _crop(proc) or image
    base = vit_tokens(crop, patch, cls, strategy)
    how = (
        f"({crop}/{patch})² patches"
        + (" + 1 CLS" if cls else "")
        + (" - 1 (strategy 'default')" * (strategy == "default"))
    )
    pins = config.get("image_grid_pinpoints") if next_ else None
    if not pins:
        return ImageTokens("llava", lambda h, w: base, base, f"LLaVA: {how} = {base} per image")
    pinpoints = [(int(p[0]), int(p[1])) for p in pins]

    def count(h: int, w: int) -> int:
        return anyres_tokens((h, w), crop, patch, pinpoints, base)

    cap = max(count(ph, pw) for ph, pw in pinpoints)
    rule = (
        f"LLaVA-NeXT anyres: base tile {how} = {base}, + the unpadded tile grid of the best of "
        f"{pinpoints} + one newline per row"
    )
    return ImageTokens("llava_next", count, cap, rule)


def _qwen2_vl(config: Mapping[str, Any], proc: Mapping[str, Any]) -> ImageTokens:
    v = dict(config.get("vision_config") or {})
    patch = int(proc.get("patch_size") or v.get("patch_size", 14))
    merge = int(proc.get("merge_size") or v.get("spatial_merge_size", 2))
    min_px = int(proc.get("min_pixels") or (proc.get("size") or {}).get("shortest_edge") or 56 * 56)
    max_px = int(proc.get("max_pixels") or (proc.get("size") or {}).get("longest_edge") or 28 * 28 * 1280)
    factor = patch * merge

    def count(h: int, w: int) -> int:
        rh, rw = qwen2_vl_resize(h, w, factor, min_px, max_px)
        return (rh // patch) * (rw // patch) // merge**2 + 2  # + <|vision_start|> <|vision_end|>

    rule = (
        f"Qwen2-VL: the image resized to multiples of {factor} px within [{min_px}, {max_px}] pixels, "
        f"(h/{patch})·(w/{patch}) patches / merge {merge}², + 2 vision start/end tokens"
    )
    return ImageTokens("qwen2_vl", count, max_px // factor**2 + 2, rule, pixels_per_token=factor**2)


def _fuyu(config: Mapping[str, Any], proc: Mapping[str, Any]) -> ImageTokens:
    ps = proc.get("patch_size") or {}
    patch = (int(ps.get("height", 30)), int(ps.get("width", 30))) if isinstance(ps, Mapping) else (int(ps), int(ps))
    if not ps:
        patch = (int(config.get("patch_size", 30)),) * 2
    size = proc.get("size") or {}
    target = (int(size.get("height", 1080)), int(size.get("width", 1920)))

    def count(h: int, w: int) -> int:
        return fuyu_tokens(h, w, patch, target)

    rule = (
        f"Fuyu: the image scaled down to fit {target[0]}x{target[1]}, ceil(h/{patch[0]}) rows × "
        f"(ceil(w/{patch[1]}) patches + 1 newline), + 1 <s>"
    )
    return ImageTokens("fuyu", count, count(*target), rule)


def _paligemma(config: Mapping[str, Any], proc: Mapping[str, Any]) -> ImageTokens:
    v = dict(config.get("vision_config") or {})
    n = int(proc.get("image_seq_length") or (int(v.get("image_size", 224)) // int(v.get("patch_size", 14))) ** 2)
    return ImageTokens("paligemma", lambda h, w: n, n, f"PaliGemma: image_seq_length = {n} per image")


def image_tokens_from_configs(config: Mapping[str, Any], processor: Mapping[str, Any]) -> ImageTokens | None:
    """The image-token rule of a VLM from its ``config.json`` and its processor configs (merged
    ``preprocessor_config.json`` + ``processor_config.json``); None for a model type without one
    here (text-only models, Idefics3 tiling)."""
    kind = str(config.get("model_type", ""))
    if kind in ("qwen2_vl", "qwen2_5_vl"):
        return _qwen2_vl(config, processor)
    if kind in ("llava", "llava_next"):
        return _llava(config, processor, kind == "llava_next")
    if kind == "fuyu":
        return _fuyu(config, processor)
    if kind == "paligemma":
        return _paligemma(config, processor)
    return None


def load_image_tokens(model_dir: str | Path) -> ImageTokens | None:
    """:func:`image_tokens_from_configs` of a model directory (``config.json``,
    ``preprocessor_config.json``, ``processor_config.json``). Raises ``OSError`` / ``ValueError``
    when ``config.json`` is missing or not JSON."""
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    processor: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = root / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):  # processor_config.json may nest the image processor's fields
                nested = data.get("image_processor")
                processor.update({**data, **nested} if isinstance(nested, dict) else data)
    return image_tokens_from_configs(config if isinstance(config, dict) else {}, processor)
