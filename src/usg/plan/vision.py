"""Vision towers of VLMs: shape, parameter count, tokens per image, activation peak.

Two families cover the supported VLMs:

* ``clip`` — a CLIP ViT with a two-layer MLP projector (LLaVA-1.5), optionally
  tiled at several resolutions ("AnyRes", LLaVA-NeXT).
* ``qwen2_vl`` — the Qwen2-VL ViT on a dynamic resolution grid of 14-pixel
  patches, with a 2×2 patch merger in front of the language model.

Token counts follow the Hugging Face processors exactly (``smart_resize`` for
Qwen2-VL, ``select_best_resolution`` / unpadding for LLaVA-NeXT; the shared arithmetic is in
:mod:`usg.vision_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from usg.errors import UsageError
from usg.plan._fields import Fields
from usg.vision_tokens import qwen2_vl_resize, select_best_resolution

__all__ = ["VisionShape", "parse_vision"]

# transformers.CLIPVisionConfig defaults: LLaVA configs only store the fields that differ.
_CLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
}
# Qwen2-VL preprocessor_config.json defaults (not part of config.json).
QWEN2_VL_MIN_PIXELS = 56 * 56
QWEN2_VL_MAX_PIXELS = 28 * 28 * 16384


@dataclass(frozen=True)
class VisionShape:
    """The vision tower and projector of a VLM, as far as memory and token counts need it."""

    kind: str  # "clip" | "qwen2_vl"
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    in_channels: int
    text_hidden_size: int
    image_size: int = 0  # native square input of a CLIP tower
    drop_cls: bool = True  # LLaVA "default" feature strategy drops the CLS token
    feature_layers: int = 1  # how many tower layers are concatenated into the projector
    grid_pinpoints: tuple[tuple[int, int], ...] = ()  # LLaVA-NeXT (height, width) tiles
    image_newline: bool = False
    spatial_merge_size: int = 1
    temporal_patch_size: int = 1
    min_pixels: int = QWEN2_VL_MIN_PIXELS
    max_pixels: int = QWEN2_VL_MAX_PIXELS

    # ---- parameters -------------------------------------------------------------------
    def tower_params(self) -> int:
        d, f = self.hidden_size, self.intermediate_size
        block = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        if self.kind == "qwen2_vl":
            patch = self.in_channels * self.temporal_patch_size * self.patch_size**2 * d
            return patch + self.num_layers * block
        positions = (self.image_size // self.patch_size) ** 2 + 1
        embeddings = self.in_channels * self.patch_size**2 * d + d + positions * d
        return embeddings + 2 * d + self.num_layers * block + 2 * d  # pre- and post-layernorm

    def projector_params(self) -> int:
        t = self.text_hidden_size
        if self.kind == "qwen2_vl":
            m = self.hidden_size * self.spatial_merge_size**2
            return 2 * self.hidden_size + (m * m + m) + (m * t + t)
        d_in = self.hidden_size * self.feature_layers
        newline = t if self.image_newline else 0
        return (d_in * t + t) + (t * t + t) + newline

    # ---- tokens ------------------------------------------------------------------------
    def default_image_size(self) -> tuple[int, int]:
        """The (width, height) the serving engine must budget for when none is given: the worst case."""
        if self.kind == "qwen2_vl":
            side = math.isqrt(self.max_pixels)
            return side, side
        if self.grid_pinpoints:
            h, w = max(self.grid_pinpoints, key=lambda hw: self._llava_next_tokens(hw[0], hw[1]))
            return w, h
        return self.image_size, self.image_size

    def image_tokens(self, image_size: tuple[int, int] | None = None) -> int:
        """Tokens one image occupies in the language model's context (and KV cache)."""
        width, height = self._size(image_size)
        if self.kind == "qwen2_vl":
            gh, gw = self._qwen_grid(height, width)
            return (gh * gw) // self.spatial_merge_size**2
        if self.grid_pinpoints:
            return self._llava_next_tokens(height, width)
        return self._crop_patches()

    def encoder_tokens(self, image_size: tuple[int, int] | None = None) -> int:
        """Tokens the vision tower itself processes for one image (all crops, CLS included)."""
        width, height = self._size(image_size)
        if self.kind == "qwen2_vl":
            gh, gw = self._qwen_grid(height, width)
            return gh * gw
        crops = 1
        if self.grid_pinpoints:
            bh, bw = self._best_resolution(height, width)
            crops += (bh // self.image_size) * (bw // self.image_size)
        return crops * ((self.image_size // self.patch_size) ** 2 + 1)

    def encoder_activation_bytes(self, image_size: tuple[int, int] | None, images: int, dtype_bytes: float) -> int:
        """Peak activation memory of one vision-tower forward over ``images`` images.

        Live tensors in the widest sub-layer of a block: the residual stream, its
        normed copy, and either the fused QKV output or the MLP hidden layer;
        attention itself is assumed memory-efficient (SDPA / flash), i.e. no
        ``tokens²`` score matrix. The projector output is added on top.
        """
        tokens = self.encoder_tokens(image_size) * images
        d = self.hidden_size
        per_token = 2 * d + max(3 * d, self.intermediate_size)
        out = self.image_tokens(image_size) * images * self.text_hidden_size
        return math.ceil((tokens * per_token + out) * dtype_bytes)

    # ---- helpers -----------------------------------------------------------------------
    def _size(self, image_size: tuple[int, int] | None) -> tuple[int, int]:
        if image_size is None:
            return self.default_image_size()
        width, height = image_size
        if width <= 0 or height <= 0:
            raise UsageError(
                f"image size {width}x{height} is not positive; fix: pass --image-size WIDTHxHEIGHT, e.g. 448x448"
            )
        return width, height

    def _crop_patches(self) -> int:
        n = (self.image_size // self.patch_size) ** 2
        return n if self.drop_cls else n + 1

    def _qwen_grid(self, height: int, width: int) -> tuple[int, int]:
        """``smart_resize`` from the Qwen2-VL image processor, returned as a patch grid."""
        factor = self.patch_size * self.spatial_merge_size
        if max(height, width) / min(height, width) > 200:
            raise UsageError(
                f"image {width}x{height} has an aspect ratio above 200, which Qwen2-VL rejects; "
                "fix: crop or pad the image"
            )
        h_bar, w_bar = qwen2_vl_resize(height, width, factor, self.min_pixels, self.max_pixels)
        return h_bar // self.patch_size, w_bar // self.patch_size

    def _best_resolution(self, height: int, width: int) -> tuple[int, int]:
        """``select_best_resolution`` from transformers' LLaVA-NeXT processing."""
        return select_best_resolution((height, width), self.grid_pinpoints)

    def _llava_next_tokens(self, height: int, width: int) -> int:
        side = self.image_size // self.patch_size
        bh, bw = self._best_resolution(height, width)
        cur_h, cur_w = side * (bh // self.image_size), side * (bw // self.image_size)
        if width / height > cur_w / cur_h:
            new_h = int(round(height * (cur_w / width), 7))
            cur_h -= 2 * ((cur_h - new_h) // 2)
        else:
            new_w = int(round(width * (cur_h / height), 7))
            cur_w -= 2 * ((cur_w - new_w) // 2)
        newline = cur_h if self.image_newline else 0
        return cur_h * cur_w + newline + self._crop_patches()


def parse_vision(cfg: Fields, model_type: str, text_hidden: int) -> VisionShape:
    """Build the :class:`VisionShape` of a VLM config (``llava``, ``llava_next``, ``qwen2_vl``)."""
    if model_type == "qwen2_vl":
        v = cfg.sub("vision_config")
        embed = v.integer("embed_dim")
        return VisionShape(
            kind="qwen2_vl",
            num_layers=v.integer("depth"),
            hidden_size=embed,
            num_heads=v.integer("num_heads"),
            intermediate_size=int(embed * v.number("mlp_ratio")),
            patch_size=v.integer("patch_size"),
            in_channels=v.integer("in_chans", 3),
            text_hidden_size=text_hidden,
            spatial_merge_size=v.integer("spatial_merge_size"),
            temporal_patch_size=v.integer("temporal_patch_size"),
        )
    v = cfg.sub("vision_config", defaults=_CLIP_DEFAULTS)
    vtype = v.string("model_type", "clip_vision_model")
    if vtype != "clip_vision_model":
        raise v.error(
            "model_type",
            vtype,
            "is not a supported vision tower",
            fix="use a LLaVA checkpoint with a CLIP tower (model_type 'clip_vision_model')",
        )
    strategy = cfg.string("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise cfg.error("vision_feature_select_strategy", strategy, "must be 'default' or 'full'")
    layer = cfg.raw("vision_feature_layer", -2)
    pinpoints: tuple[tuple[int, int], ...] = ()
    if model_type == "llava_next":
        raw = cfg.raw("image_grid_pinpoints")
        try:
            pinpoints = tuple((int(h), int(w)) for h, w in raw)
        except (TypeError, ValueError):
            raise cfg.error("image_grid_pinpoints", raw, "must be a list of [height, width] pairs") from None
    shape = VisionShape(
        kind="clip",
        num_layers=v.integer("num_hidden_layers"),
        hidden_size=v.integer("hidden_size"),
        num_heads=v.integer("num_attention_heads"),
        intermediate_size=v.integer("intermediate_size"),
        patch_size=v.integer("patch_size"),
        in_channels=v.integer("num_channels"),
        text_hidden_size=text_hidden,
        image_size=v.integer("image_size"),
        drop_cls=strategy == "default",
        feature_layers=len(layer) if isinstance(layer, list) else 1,
        grid_pinpoints=pinpoints,
        image_newline=model_type == "llava_next" and cfg.flag("use_image_newline_parameter", True),
    )
    cfg.defaulted.extend(v.defaulted)
    return shape
