"""Image decoding with limits, and generic image → tensor conversions."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, PayloadTooLarge
from usg.ops.signature import op
from usg.specs import TensorSpec

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "decode_image", "to_nchw_float"]

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000


def decode_image(value: Any, *, field: str = "image", max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """Decode a path, bytes or an array into an RGB uint8 HWC array.

    The pixel limit is checked from the header, before the pixels are decoded, so a
    decompression bomb costs nothing. Errors name the field and say how to fix it.
    """
    if isinstance(value, np.ndarray):
        return _check_array(value, field, max_pixels)
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.exists():
            raise InputError(
                f"{field}: file {str(path)!r} does not exist",
                field=field,
                fix="pass the path of an existing image file",
            )
        if path.is_dir():
            raise InputError(f"{field}: {str(path)!r} is a directory", field=field, fix="pass an image file")
        data = path.read_bytes()
        label = f"file {str(path)!r}"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        label = f"{len(data)} bytes"
    else:
        raise InputError(
            f"{field}: got {type(value).__name__}",
            field=field,
            fix="pass an image as a file path, encoded bytes (PNG/JPEG/...) or a uint8 HxWx3 array",
        )
    if not data:
        raise InputError(f"{field}: {label} is empty (0 bytes)", field=field, fix="send the image's bytes")
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        head = data[:8].hex()
        raise InputError(
            f"{field}: {label} is not a decodable image (first bytes {head})",
            field=field,
            fix="send a PNG, JPEG, BMP, TIFF or WebP file",
        ) from None
    except Image.DecompressionBombError:
        raise PayloadTooLarge(
            f"{field}: {label} declares an image far above the pixel limit",
            field=field,
            fix=f"send an image of at most {max_pixels} pixels",
        ) from None
    w, h = img.size
    if w * h > max_pixels:
        raise PayloadTooLarge(
            f"{field}: image is {w}x{h} = {w * h} pixels, above the limit of {max_pixels}",
            field=field,
            fix="downscale the image, or raise limits.max_image_pixels in the graph",
        )
    if w == 0 or h == 0:
        raise InputError(f"{field}: image is {w}x{h}", field=field, fix="send a non-empty image")
    try:
        rgb = img.convert("RGB")
        arr = np.asarray(rgb, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(
            f"{field}: {label} is truncated or corrupt ({exc})",
            field=field,
            fix="re-encode or re-upload the image",
        ) from None
    return arr


def _check_array(arr: np.ndarray, field: str, max_pixels: int) -> np.ndarray:
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise InputError(f"{field}: array of shape {list(arr.shape)}", field=field, fix="pass an HxWx3 uint8 RGB array")
    if arr.dtype != np.uint8:
        raise InputError(
            f"{field}: array dtype {arr.dtype}, expected uint8",
            field=field,
            fix="convert with (x * 255).clip(0, 255).astype(np.uint8) if it is a float image in [0,1]",
        )
    h, w = arr.shape[:2]
    if h == 0 or w == 0:
        raise InputError(f"{field}: image array is {w}x{h}", field=field, fix="pass a non-empty image")
    if h * w > max_pixels:
        raise PayloadTooLarge(
            f"{field}: image is {w}x{h} = {w * h} pixels, above the limit of {max_pixels}",
            field=field,
            fix="downscale the image, or raise limits.max_image_pixels",
        )
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] == 4:
        arr = arr[:, :, :3]
    return arr


@op(
    inputs={"image": TensorSpec("uint8", ("H", "W", 3), layout="HWC")},
    outputs={"x": TensorSpec("float32", (1, 3, "H", "W"), range=(0.0, 1.0), layout="NCHW")},
)
def to_nchw_float(image: np.ndarray) -> dict[str, np.ndarray]:
    """uint8 HWC in [0,255] → float32 NCHW in [0,1] with a batch axis of 1."""
    x = image.astype(np.float32).transpose(2, 0, 1)[None] / 255.0
    return {"x": np.ascontiguousarray(x)}
