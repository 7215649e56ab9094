"""Vision-token arithmetic of VLM families, computed twice: as the model sees it and as the processor does.

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

import math
from collections.abc import Sequence

__all__ = [
    "anyres_tokens",
    "has_cls",
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
