"""Node functions for the serve tests (the e2e server process imports them via PYTHONPATH)."""

from __future__ import annotations

import time
from typing import Any


def slow_echo(text: str, default_delay: float = 0.0) -> dict[str, Any]:
    """Echo ``text``; ``"sleep:0.5 rest"`` sleeps 0.5 s first (else ``default_delay``)."""
    delay = default_delay
    if text.startswith("sleep:"):
        head = text.split()[0]
        delay = float(head.removeprefix("sleep:"))
    time.sleep(delay)
    return {"text": text, "length": len(text)}


def image_shape(image: Any) -> dict[str, Any]:
    """The decoded image's (H, W, C) as an int64 array: small to return, proves the decode."""
    import numpy as np

    return {"shape": np.asarray(image.shape, dtype=np.int64)}
