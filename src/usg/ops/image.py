"""Image decoding with limits, and generic image → tensor conversions."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, PayloadTooLarge
from usg.ops.files import read_input_file
from usg.ops.signature import op
from usg.specs import TensorSpec

__all__ = [
    "DEFAULT_IMAGE_FORMATS",
    "DEFAULT_MAX_ASPECT_RATIO",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageLimits",
    "decode_image",
    "probe_image",
    "to_nchw_float",
]

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_MAX_ASPECT_RATIO = 50.0
# Pillow format names decoded by default; EPS is never decoded (Pillow hands it to Ghostscript)
DEFAULT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF")
_NEVER = frozenset({"EPS"})


@dataclass(frozen=True)
class ImageLimits:
    """What an image input accepts: pixels (from the header), long/short side ratio, formats."""

    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO
    formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS

    def allowed(self) -> list[str]:
        return [f for f in self.formats if f not in _NEVER]

    def check_size(self, field: str, w: int, h: int) -> None:
        """413 above the pixel or aspect-ratio limit; 400 for an empty image. Costs nothing."""
        if w <= 0 or h <= 0:
            raise InputError(f"{field}: image is {w}x{h}", field=field, fix="send a non-empty image")
        if w * h > self.max_pixels:
            raise PayloadTooLarge(
                f"{field}: image is {w}x{h} = {w * h} pixels, above the limit of {self.max_pixels}",
                field=field,
                fix="downscale the image, or raise limits.max_image_pixels in the graph",
            )
        ratio = max(w, h) / min(w, h)
        if ratio > self.max_aspect_ratio:
            raise PayloadTooLarge(
                f"{field}: image is {w}x{h}, an aspect ratio of {ratio:.0f}:1, above the limit of "
                f"{self.max_aspect_ratio:g}:1",
                field=field,
                fix="crop or pad the image to less extreme proportions, or raise limits.max_aspect_ratio in the graph",
            )


def decode_image(
    value: Any,
    *,
    field: str = "image",
    max_pixels: int | None = None,
    limits: ImageLimits | None = None,
) -> np.ndarray:
    """Decode a path, bytes or an array into an RGB uint8 HWC array.

    Size limits are checked from the header, before the pixels are decoded, so a
    decompression bomb costs nothing; only the allowed formats' decoders are tried.
    Errors name the field and say how to fix it.
    """
    if limits is None:
        limits = ImageLimits(max_pixels=max_pixels or DEFAULT_MAX_IMAGE_PIXELS)
    if isinstance(value, np.ndarray):
        return _check_array(value, field, limits)
    data, label = _image_bytes(value, field)
    return _decode_bytes(data, field, label, limits)


def probe_image(value: Any, *, field: str = "image", limits: ImageLimits | None = None) -> tuple[int, int]:
    """(width, height) of an image input after every check :func:`decode_image` makes from the
    header (type, emptiness, allowed format, pixels, aspect ratio), without decoding pixels.

    The node cache answers a repeated image from its bytes' digest without decoding it: this
    keeps every limit that the decode would enforce in front of that hit (the pixels of an
    image that was decoded once under the same limits decode again)."""
    limits = limits or ImageLimits()
    if isinstance(value, np.ndarray):
        arr = _check_array(value, field, limits)
        return int(arr.shape[1]), int(arr.shape[0])
    data, label = _image_bytes(value, field)
    with _open(data, field, label, limits) as img:
        w, h = img.size
        limits.check_size(field, w, h)
    return int(w), int(h)


def _image_bytes(value: Any, field: str) -> tuple[bytes, str]:
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
        data = read_input_file(path, field)  # /dev/stdin works; /dev/zero stops at a bound
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
        raise InputError(
            f"{field}: {'the image' if label.endswith(' bytes') else label} is empty (0 bytes)",
            field=field,
            fix="send the image's bytes",
        )
    return data, label


def _open(data: bytes, field: str, label: str, limits: ImageLimits) -> Any:
    """The image opened lazily (its header read) with only the allowed formats' decoders."""
    from PIL import Image, UnidentifiedImageError

    allowed = limits.allowed()
    corrupt = InputError(
        f"{field}: {label} is a truncated or corrupt image",
        field=field,
        fix="re-encode or re-upload the image",
    )
    try:
        return Image.open(io.BytesIO(data), formats=allowed)
    except UnidentifiedImageError:
        head = data[:8].hex()
        raise InputError(
            f"{field}: {label} is not a decodable image (first bytes {head}) of an allowed format "
            f"({', '.join(allowed)})",
            field=field,
            fix=f"send a {', '.join(allowed)} file (limits.image_formats in the graph lists the formats accepted)",
        ) from None
    except Image.DecompressionBombError as exc:  # PIL refuses before our size check can read the header
        declared = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{declared.group(1)} pixels" if declared else "an image far above the pixel limit"
        raise PayloadTooLarge(
            f"{field}: {label} declares {size}, above the limit of {limits.max_pixels}",
            field=field,
            fix="downscale the image, or raise limits.max_image_pixels in the graph",
        ) from None
    except Exception:  # any decoder failure on untrusted bytes is the input's fault, not a server error
        raise corrupt from None


def _decode_bytes(data: bytes, field: str, label: str, limits: ImageLimits) -> np.ndarray:
    with _open(data, field, label, limits) as img:
        w, h = img.size
        limits.check_size(field, w, h)
        try:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except Exception as exc:  # truncated data surfaces as OSError, EOFError, struct.error, ValueError ...
            raise InputError(
                f"{field}: {label} is a truncated or corrupt {img.format} image ({exc})",
                field=field,
                fix="re-encode or re-upload the image",
            ) from None
    return arr


def _check_array(arr: np.ndarray, field: str, limits: ImageLimits) -> np.ndarray:
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
    limits.check_size(field, w, h)
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
