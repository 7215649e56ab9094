"""A headless Chromium for tests that look at what USG renders (HTML reports, plots, the docs site).

The browser is Playwright's own Chromium when ``playwright install chromium`` could fetch it, else
a system Chromium (Debian's ``chromium`` package; ``USG_CHROMIUM`` names another binary).
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PixelStats", "find_chromium", "pixel_stats"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(playwright: object | None = None) -> str | None:
    """The Chromium binary to launch, or None when there is none."""
    explicit = os.environ.get("USG_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    if playwright is not None:
        bundled = Path(getattr(playwright, "chromium").executable_path)  # noqa: B009
        if bundled.exists():
            return str(bundled)
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class PixelStats:
    width: int
    height: int
    std: float  # standard deviation of the grey levels (0: a flat picture)
    ink: float  # share of pixels that differ from the most common colour (the background)
    colours: int  # distinct colours (after quantising to 4 bits per channel)

    def blank(self, *, min_std: float = 8.0, min_ink: float = 0.02) -> bool:
        return self.std < min_std or self.ink < min_ink


def pixel_stats(png: bytes) -> PixelStats:
    """How much is drawn in a PNG (a screenshot or a plot)."""
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int32)
    h, w, _ = rgb.shape
    grey = rgb.mean(axis=2)
    packed = ((rgb[..., 0] >> 4) << 8) | ((rgb[..., 1] >> 4) << 4) | (rgb[..., 2] >> 4)
    values, counts = np.unique(packed, return_counts=True)
    background = values[int(np.argmax(counts))]
    ink = float((packed != background).mean())
    return PixelStats(w, h, float(grey.std()), ink, int(values.size))
