"""DB text-detection post-processing (RapidOCR's ``DBPostProcess``), split where an engine may cut it.

:func:`det_candidates` reads the text boxes off det's float32 probability map, in the map's own
pixels (threshold, dilation, contours, box score, unclip); :func:`scale_candidates` maps them to
the image det's input was resized from, with RapidOCR's rounding. Together they compute what
``DBPostProcess.__call__`` does, box for box. ``usg.ops.ocr:det_postprocess`` declares
:func:`det_candidates` as the reducer of its ``prob`` input, so the Ray engine runs it on det's
replica: the map (4.2 MB for a 736×1440 page) stays there and only the boxes cross.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import cv2
import numpy as np

__all__ = ["DetCandidates", "det_candidates", "scale_candidates"]

_THRESH = 0.3  # RapidOCR's default binarisation threshold
_MAX_CANDIDATES = 1000


@dataclass(frozen=True)
class DetCandidates:
    """Text boxes found in one probability map, before scaling to the image."""

    boxes: np.ndarray  # float32 [N, 4, 2], in the map's pixels (x, y)
    map_shape: tuple[int, int]  # (height, width) of the map


@cache
def _db(box_thresh: float, unclip_ratio: float) -> Any:
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    return DBPostProcess(
        thresh=_THRESH,
        box_thresh=box_thresh,
        max_candidates=_MAX_CANDIDATES,
        unclip_ratio=unclip_ratio,
        score_mode="fast",
        use_dilation=True,
    )


def det_candidates(prob: np.ndarray, *, box_thresh: float = 0.5, unclip_ratio: float = 1.6) -> DetCandidates:
    """The boxes of a ``[1, 1, H, W]`` DB probability map (``DBPostProcess.boxes_from_bitmap``
    up to, not including, its scaling to the destination size)."""
    post = _db(box_thresh, unclip_ratio)
    pred = np.asarray(prob)[:, 0, :, :]
    mask = cv2.dilate((pred[0] > post.thresh).astype(np.uint8), post.dilation_kernel)
    height, width = mask.shape
    outs = cv2.findContours((mask * 255).astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    contours = outs[1] if len(outs) == 3 else outs[0]
    boxes: list[np.ndarray] = []
    for contour in contours[: post.max_candidates]:
        points, sside = post.get_mini_boxes(contour)
        if sside < post.min_size:
            continue
        if post.box_thresh > post.box_score_fast(pred[0], points.reshape(-1, 2)):
            continue
        box, sside = post.get_mini_boxes(post.unclip(points))
        if sside < post.min_size + 2:
            continue
        boxes.append(box)
    stacked = np.stack(boxes) if boxes else np.zeros((0, 4, 2), np.float32)
    return DetCandidates(stacked, (int(height), int(width)))


def scale_candidates(candidates: DetCandidates, shape: tuple[int, int]) -> list[np.ndarray]:
    """The boxes in an ``(h, w)`` image's pixels, int32 [4, 2] each (RapidOCR's rounding and clip)."""
    height, width = candidates.map_shape
    dest_h, dest_w = shape
    out = []
    for found in candidates.boxes:
        box = found.copy()
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        out.append(box.astype(np.int32))
    return out
