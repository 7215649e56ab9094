"""PP-OCR pre/post-processing as graph node functions, built on RapidOCR's own helpers.

The steps mirror ``rapidocr_onnxruntime.RapidOCR.__call__`` with its default
configuration, split at every model call so the executor can batch and overlap
them: resize/letterbox → det → DB post-process → crop lines → cls → rotate →
rec → CTC decode → map boxes back to the original image.
"""

from __future__ import annotations

import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from usg.errors import MissingDependency, PayloadTooLarge
from usg.ops.buffers import BufferPool
from usg.ops.ocr_db import DetCandidates, det_candidates, scale_candidates
from usg.ops.signature import ListOf, op
from usg.ops.wire import BestPath, best_path, derived
from usg.specs import TensorSpec

__all__ = [
    "cls_preprocess",
    "crop_lines",
    "ctc_decode",
    "det_plan",
    "det_postprocess",
    "det_preprocess",
    "join_text",
    "rec_preprocess",
]

_MAX_SIDE = 2000
_MIN_SIDE = 30
_MIN_HEIGHT = 30
_WH_RATIO = 8
_REC_SHAPE = (3, 48, 320)
_CLS_SHAPE = (3, 48, 192)
DEFAULT_MAX_PREPROCESSED_PIXELS = 8_000_000  # the det input: 96 MB of float32
_DET_INPUTS = BufferPool()  # det's float32 inputs, alive until det has run on them
_RESIZED = BufferPool()  # the resized uint8 page, scratch inside _det_input


def _rapidocr() -> Any:
    try:
        import rapidocr_onnxruntime.utils as utils
    except ImportError:
        raise MissingDependency("rapidocr_onnxruntime", "ocr", "the document OCR ops") from None
    return utils


@cache
def _det_resizer(limit_side_len: int) -> Any:
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

    return DetPreProcess(limit_side_len, "min", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])


def _scaled(h: int, w: int, ratio: float) -> tuple[int, int]:
    """RapidOCR's resize arithmetic: scale, truncate, round to a multiple of 32."""
    return int(round(int(h * ratio) / 32) * 32), int(round(int(w * ratio) / 32) * 32)


def det_plan(h: int, w: int, limit_side_len: int = 736) -> tuple[int, int] | None:
    """The (H, W) of the det input ``det_preprocess`` makes from an ``h`` x ``w`` image, computed
    without touching pixels; None when a resize step would reach a zero side (RapidOCR fails there)."""
    if max(h, w) > _MAX_SIDE:
        h, w = _scaled(h, w, _MAX_SIDE / (h if h > w else w))
        if h <= 0 or w <= 0:
            return None
    if min(h, w) < _MIN_SIDE:
        h, w = _scaled(h, w, _MIN_SIDE / (h if h < w else w))
        if h <= 0 or w <= 0:
            return None
    if h <= _MIN_HEIGHT or w / h > _WH_RATIO:
        h += 2 * int(abs(max(int(w / _WH_RATIO), _MIN_HEIGHT) * 2 - h) / 2)
    ratio = limit_side_len / (h if h < w else w) if min(h, w) < limit_side_len else 1.0
    h, w = _scaled(h, w, ratio)
    return (h, w) if h > 0 and w > 0 else None


def _check_det_plan(image: np.ndarray, limit_side_len: int, max_pixels: int) -> None:
    raw_h, raw_w = image.shape[:2]
    plan = det_plan(raw_h, raw_w, limit_side_len)
    ratio = max(raw_h, raw_w) / max(1, min(raw_h, raw_w))
    if plan is None:
        raise PayloadTooLarge(
            f"image: a {raw_w}x{raw_h} image (aspect ratio {ratio:.0f}:1) cannot be scaled for text detection "
            f"(a side would shrink to 0 px)",
            field="image",
            fix="crop or pad the image to less extreme proportions (see limits.max_aspect_ratio in the graph)",
        )
    h, w = plan
    if h * w > max_pixels:
        raise PayloadTooLarge(
            f"image: detection pre-processing would scale the {raw_w}x{raw_h} image (aspect ratio {ratio:.0f}:1) "
            f"to {w}x{h} = {h * w} pixels, above the limit of {max_pixels}",
            field="image",
            fix="crop or pad the image to less extreme proportions, or raise options.max_pixels of the "
            "usg.ops.ocr:det_preprocess node in the graph (e.g. nodes.det_pre.options.max_pixels)",
        )


@op(
    inputs={"image": TensorSpec("uint8", ("H", "W", 3), layout="HWC")},
    outputs={"x": TensorSpec("float32", (1, 3, None, None), layout="NCHW"), "meta": None},
)
def det_preprocess(
    image: np.ndarray, *, limit_side_len: int = 736, max_pixels: int = DEFAULT_MAX_PREPROCESSED_PIXELS
) -> dict[str, Any]:
    """RGB HWC uint8 → the det model's input, plus what post-processing needs to map boxes back.

    The output size is computed first (:func:`det_plan`): an image whose det input would
    exceed ``max_pixels`` (thin strips are scaled up a lot) is refused with 413 before any
    pixel is allocated.
    """
    _check_det_plan(image, limit_side_len, max_pixels)
    _opencv_in_calling_thread()
    utils = _rapidocr()
    img = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    raw_h, raw_w = img.shape[:2]
    ratio_h = ratio_w = 1.0
    if max(raw_h, raw_w) > _MAX_SIDE:
        img, ratio_h, ratio_w = utils.reduce_max_side(img, _MAX_SIDE)
    if min(img.shape[:2]) < _MIN_SIDE:
        img, ratio_h, ratio_w = utils.increase_min_side(img, _MIN_SIDE)
    ops: list[tuple[str, dict[str, float]]] = [("preprocess", {"ratio_h": ratio_h, "ratio_w": ratio_w})]
    h, w = img.shape[:2]
    top = 0
    if h <= _MIN_HEIGHT or w / h > _WH_RATIO:
        new_h = max(int(w / _WH_RATIO), _MIN_HEIGHT) * 2
        top = int(abs(new_h - h) / 2)
        img = utils.add_round_letterbox(img, (top, top, 0, 0))
    ops.append(("padding", {"top": top, "left": 0}))
    meta = {"image": img, "raw_shape": (raw_h, raw_w), "ops": ops}
    # between processes (the Ray engine) x travels as the uint8 image before det's resize (which only
    # ever scales up), and is resized and normalised on det's replica
    h, w = img.shape[:2]  # after the letterbox
    det_h, det_w = _scaled(h, w, limit_side_len / min(h, w) if min(h, w) < limit_side_len else 1.0)
    x = derived(_det_input, img, limit_side_len, shape=(1, 3, det_h, det_w), dtype="float32")
    return {"x": x, "meta": meta}


def _det_input(img: np.ndarray, limit_side_len: int = 736) -> np.ndarray:
    _opencv_in_calling_thread()
    # RapidOCR's resize (DetPreProcess.resize: min side to limit_side_len, both sides to multiples of
    # 32, cv2.resize's default bilinear), into a reused scratch page
    src_h, src_w = img.shape[:2]
    h, w = _scaled(src_h, src_w, limit_side_len / min(src_h, src_w) if min(src_h, src_w) < limit_side_len else 1.0)
    resized = cv2.resize(img, (w, h), dst=_RESIZED.empty((h, w, *img.shape[2:]), img.dtype))
    # (x / 255 - 0.5) / 0.5 in float32 (RapidOCR computes it in float64 and casts: same values to ~1e-7,
    # at a third of the cost on a 1536x736 page), written channel by channel straight into the
    # [1, 3, H, W] input: no float32 HWC page and no transposing copy of it (same float32 operations,
    # so the same bits as astype, *=, -= and the transpose); on reused memory (usg.ops.buffers)
    x = _DET_INPUTS.empty((1, 3, h, w), np.float32)
    for c in range(3):
        np.multiply(resized[:, :, c], np.float32(2.0 / 255.0), out=x[0, c], dtype=np.float32)
    x -= np.float32(1.0)
    return x


@cache
def _opencv_in_calling_thread() -> None:
    """Run OpenCV's functions in the thread that calls them (``cv2.setNumThreads(0)``, process-wide),
    unless ``OPENCV_FOR_THREADS_NUM`` sets its pool. The executor already runs one CPU-bound call per
    core; OpenCV's own pool split the page resize, colour conversion and dilation across every core
    on top of that, and its workers' waking and spin-waiting cost more CPU than they saved
    (benchmarks/README.md, issue #21, session 12)."""
    if "OPENCV_FOR_THREADS_NUM" not in os.environ:
        cv2.setNumThreads(0)


def _order_clockwise(pts: np.ndarray) -> np.ndarray:
    xs = pts[np.argsort(pts[:, 0]), :]
    left = xs[:2][np.argsort(xs[:2, 1])]
    right = xs[2:][np.argsort(xs[2:, 1])]
    (tl, bl), (tr, br) = left, right
    return np.array([tl, tr, br, bl], dtype=np.float32)


def _sorted_boxes(boxes: list[np.ndarray]) -> list[np.ndarray]:
    """Reading order: top to bottom, then left to right within ~10 px rows (RapidOCR's rule)."""
    out = sorted(boxes, key=lambda b: (b[0][1], b[0][0]))
    for i in range(len(out) - 1):
        for j in range(i, -1, -1):
            if abs(out[j + 1][0][1] - out[j][0][1]) < 10 and out[j + 1][0][0] < out[j][0][0]:
                out[j], out[j + 1] = out[j + 1], out[j]
            else:
                break
    return out


@op(
    inputs={"prob": TensorSpec("float32", (1, 1, None, None))},
    outputs={"boxes": ListOf(TensorSpec("float32", (4, 2)))},
    # the Ray engine reads the boxes off the map on det's replica: boxes cross, not the float32 map
    reducers={"prob": "usg.ops.ocr_db:det_candidates"},
)
def det_postprocess(
    prob: np.ndarray | DetCandidates, meta: dict[str, Any], *, box_thresh: float = 0.5, unclip_ratio: float = 1.6
) -> dict[str, Any]:
    """DB probability map (or the :class:`~usg.ops.ocr_db.DetCandidates` read off it) → text boxes
    (4×2, in the pre-processed image) in reading order."""
    if not isinstance(prob, DetCandidates):
        prob = det_candidates(prob, box_thresh=box_thresh, unclip_ratio=unclip_ratio)
    h, w = meta["image"].shape[:2]
    boxes = scale_candidates(prob, (h, w))
    kept: list[np.ndarray] = []
    for box in boxes:
        box = _order_clockwise(np.asarray(box, dtype=np.float32))
        box[:, 0] = np.clip(box[:, 0], 0, w - 1).astype(np.int64)
        box[:, 1] = np.clip(box[:, 1], 0, h - 1).astype(np.int64)
        if int(np.linalg.norm(box[0] - box[1])) <= 3 or int(np.linalg.norm(box[0] - box[3])) <= 3:
            continue
        kept.append(box)
    return {"boxes": _sorted_boxes(kept)}


@op(outputs={"items": ListOf(TensorSpec("uint8", (None, None, 3)))})
def crop_lines(boxes: list[np.ndarray], meta: dict[str, Any]) -> dict[str, Any]:
    """Perspective-crop each box from the pre-processed image (vertical crops turned upright)."""
    img = meta["image"]
    crops = []
    for pts in boxes:
        pts = pts.astype(np.float32)
        cw = int(max(np.linalg.norm(pts[0] - pts[1]), np.linalg.norm(pts[2] - pts[3])))
        ch = int(max(np.linalg.norm(pts[0] - pts[3]), np.linalg.norm(pts[1] - pts[2])))
        dst = np.array([[0, 0], [cw, 0], [cw, ch], [0, ch]], dtype=np.float32)
        m = cv2.getPerspectiveTransform(pts, dst)
        crop = cv2.warpPerspective(img, m, (cw, ch), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
        if crop.shape[0] / crop.shape[1] >= 1.5:
            crop = np.rot90(crop)
        crops.append(np.ascontiguousarray(crop))
    return {"items": crops}


def _resize_norm(img: np.ndarray, shape: tuple[int, int, int], width: int) -> np.ndarray:
    c, h, _ = shape
    ratio = img.shape[1] / float(img.shape[0])
    resized_w = width if math.ceil(h * ratio) > width else math.ceil(h * ratio)
    resized = cv2.resize(img, (resized_w, h)).astype(np.float32).transpose(2, 0, 1) / 255
    resized = (resized - 0.5) / 0.5
    out = np.zeros((c, h, width), dtype=np.float32)
    out[:, :, :resized_w] = resized
    return out[None]


@op(
    inputs={"items": ListOf(TensorSpec("uint8", (None, None, 3)))},
    outputs={"items": ListOf(TensorSpec("float32", (1, 3, 48, 192)))},
)
def cls_preprocess(items: list[np.ndarray]) -> dict[str, Any]:
    """Each crop → the direction classifier's input (3×48×192, padded right)."""
    shape = (1, *_CLS_SHAPE)
    return {"items": [derived(_resize_norm, c, _CLS_SHAPE, _CLS_SHAPE[2], shape=shape, dtype="float32") for c in items]}


def rec_widths(crops: list[np.ndarray], *, policy: str = "rapidocr", group: int = 6) -> list[int]:
    """The rec input width for each crop.

    ``rapidocr`` reproduces RapidOCR exactly: crops sorted by aspect ratio, taken 6 at a time,
    each padded to 48 × max(320/48, largest ratio of its group). The rec model is not
    pad-safe (a wider pad can change the text it reads), so matching RapidOCR's widths is
    what makes the output identical; crops of one group then share a shape and batch together.
    ``per_line`` pads each crop only to 48 × max(320/48, its own ratio).
    """
    _, h, w = _REC_SHAPE
    ratios = [c.shape[1] / float(c.shape[0]) for c in crops]
    if policy == "per_line":
        return [int(h * max(w / h, r)) for r in ratios]
    if policy != "rapidocr":
        raise ValueError(f"rec width policy {policy!r}; use 'rapidocr' or 'per_line'")
    order = np.argsort(np.array(ratios))
    widths = [0] * len(crops)
    for start in range(0, len(order), group):
        chunk = order[start : start + group]
        width = int(h * max([w / h, *(ratios[i] for i in chunk)]))
        for i in chunk:
            widths[i] = width
    return widths


@op(
    inputs={
        "crops": ListOf(TensorSpec("uint8", (None, None, 3))),
        "cls": ListOf(TensorSpec("float32", (1, 2))),
    },
    outputs={"items": ListOf(TensorSpec("float32", (1, 3, 48, None))), "crops": ListOf()},
)
def rec_preprocess(
    crops: list[np.ndarray], cls: list[np.ndarray], *, cls_thresh: float = 0.9, widths: str = "rapidocr"
) -> dict[str, Any]:
    """Turn crops the classifier reads as upside down (label 180, score > threshold), then normalise for rec."""
    upright = []
    for crop, probs in zip(crops, cls, strict=True):
        p = np.asarray(probs).reshape(-1)
        if int(p.argmax()) == 1 and float(p[1]) > cls_thresh:
            crop = cv2.rotate(crop, cv2.ROTATE_180)
        upright.append(crop)
    sizes = rec_widths(upright, policy=widths)
    c, h = _REC_SHAPE[:2]
    items = [
        derived(_resize_norm, crop, _REC_SHAPE, wd, shape=(1, c, h, wd), dtype="float32")
        for crop, wd in zip(upright, sizes, strict=True)
    ]
    return {"items": items, "crops": upright}


@cache
def _vocabulary(model_path: str) -> list[str]:
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise ValueError(f"{model_path} carries no 'character' metadata; pass a PP-OCR rec model")
    chars = meta["character"].splitlines()
    return ["blank", *chars, " "]


def _map_back(box: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    pts = box.astype(np.float32).copy()
    for name, v in reversed(meta["ops"]):
        if name == "padding":
            pts[:, 0] -= v["left"]
            pts[:, 1] -= v["top"]
        else:
            pts[:, 0] *= v["ratio_w"]
            pts[:, 1] *= v["ratio_h"]
    raw_h, raw_w = meta["raw_shape"]
    pts = np.maximum(pts, 0)
    pts[:, 0] = np.minimum(pts[:, 0], raw_w)
    pts[:, 1] = np.minimum(pts[:, 1], raw_h)
    return pts


@op(
    inputs={"probs": ListOf(TensorSpec("float32", (1, None, None)))},
    outputs={"lines": ListOf(), "text": None},
    reducers={"probs": "usg.ops.wire:best_path"},  # the Ray engine sends rec's best path, not T x 6625
)
def ctc_decode(
    probs: list[np.ndarray | BestPath],
    boxes: list[np.ndarray],
    meta: dict[str, Any],
    *,
    vocab_model: str,
    text_score: float = 0.5,
) -> dict[str, Any]:
    """Greedy CTC decode each line; keep lines scoring ≥ ``text_score``; boxes in original pixels.

    ``text`` is the lines joined with newlines, or ``None`` when nothing was read (so nodes
    that embed it are skipped and the embedding output comes back absent).
    """
    from usg.paths import resolve_path

    vocab = _vocabulary(str(resolve_path(vocab_model, Path.cwd())))
    lines = []
    for p, box in zip(probs, boxes, strict=True):
        best = p if isinstance(p, BestPath) else best_path(p)
        idx, conf = best.indices, best.scores
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        keep &= idx != 0
        chars = [vocab[i] for i in idx[keep]]
        score = float(np.mean(conf[keep])) if keep.any() else 0.0
        text = "".join(chars)
        if score >= text_score:
            lines.append({"text": text, "score": score, "box": _map_back(box, meta).tolist()})
    joined = "\n".join(line["text"] for line in lines)
    return {"lines": lines, "text": joined or None}


@op(outputs={"text": None})
def join_text(lines: list[dict[str, Any]], *, sep: str = "\n") -> dict[str, Any]:
    """Join OCR lines into one string (``None`` when there are none)."""
    return {"text": sep.join(line["text"] for line in lines) or None}
