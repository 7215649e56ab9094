"""Render document images with known text, for OCR tests and smoke checks of a deployment."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Line", "font_path", "render_document"]


def font_path(name: str = "DejaVuSans.ttf") -> Path:
    """A TrueType font shipped inside matplotlib (DejaVu family), so no system fonts are needed."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        from usg.errors import MissingDependency

        raise MissingDependency("matplotlib", "report", "rendering test documents (its DejaVu fonts)")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "mpl-data" / "fonts" / "ttf" / name
    if not path.is_file():
        raise FileNotFoundError(f"font {name} not found in {path.parent}")
    return path


@dataclass(frozen=True)
class Line:
    text: str
    size: int = 28
    font: str = "DejaVuSans.ttf"
    angle: float = 0.0  # degrees, counter-clockwise


def render_document(lines: Sequence[Line], *, width: int = 900, margin: int = 40, gap: int = 26) -> np.ndarray:
    """Black text on white, one line per entry, top to bottom; returns RGB uint8 HWC."""
    from PIL import Image, ImageDraw, ImageFont

    blocks = []
    for line in lines:
        font = ImageFont.truetype(str(font_path(line.font)), line.size)
        left, top, right, bottom = font.getbbox(line.text)
        tile = Image.new("L", (int(right - left) + 16, int(bottom - top) + 16), 255)
        ImageDraw.Draw(tile).text((8 - left, 8 - top), line.text, fill=0, font=font)
        if line.angle:
            tile = tile.rotate(line.angle, expand=True, fillcolor=255, resample=Image.Resampling.BICUBIC)
        blocks.append(tile)
    height = margin * 2 + sum(b.height for b in blocks) + gap * max(0, len(blocks) - 1)
    page = Image.new("L", (max(width, max((b.width for b in blocks), default=0) + 2 * margin), height), 255)
    y = margin
    for b in blocks:
        page.paste(b, (margin, y))
        y += b.height + gap
    return np.asarray(page.convert("RGB"), dtype=np.uint8)
