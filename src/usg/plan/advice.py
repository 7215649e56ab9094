"""When a target does not fit: which knob to turn, and by how much.

Each suggestion is checked by re-running :func:`usg.plan.memory.evaluate` with
that one knob changed, so every number printed is one that fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from usg.plan.architectures import ModelShape
from usg.plan.hardware import GPUProfile
from usg.plan.memory import Evaluation, Target, evaluate, valid_tensor_parallel

__all__ = ["Advice", "advise", "min_tensor_parallel"]

_GIB = 1024**3
_TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Advice:
    """Turn ``knob`` from ``current`` to ``suggested``; ``detail`` says why and by how much."""

    knob: str
    current: str
    suggested: str
    detail: str

    def __str__(self) -> str:
        return f"{self.knob}: {self.current} → {self.suggested} ({self.detail})"

    def as_dict(self) -> dict[str, str]:
        return {
            "knob": self.knob,
            "current": self.current,
            "suggested": self.suggested,
            "detail": self.detail,
        }


def min_tensor_parallel(m: ModelShape, gpu: GPUProfile, t: Target) -> int | None:
    """Smallest valid tensor-parallel degree at which the target fits (``None``: not up to 64)."""
    for tp in _TP_CANDIDATES:
        if valid_tensor_parallel(m, tp) and evaluate(m, gpu, t, tp).fits:
            return tp
    return None


def _gib(n: float) -> str:
    return f"{n / _GIB:.2f} GiB"


def advise(m: ModelShape, gpu: GPUProfile, ev: Evaluation, gpu_count: int) -> list[Advice]:
    """Knob changes that each make ``ev.target`` fit on ``gpu`` (empty when it already fits)."""
    if ev.fits:
        return []
    t, tp, mem = ev.target, ev.tensor_parallel_size, ev.memory
    out: list[Advice] = []
    if ev.prompt_image_tokens >= t.max_model_len:
        out.extend(_context_advice(m, gpu, ev))
    static = mem.weights + mem.activations
    if static >= mem.budget:
        out.append(
            Advice(
                "weights",
                _gib(mem.weights),
                f"< {_gib(mem.budget - mem.activations)}",
                f"weights + activations ({_gib(static)}) exceed the {_gib(mem.budget)} budget per GPU "
                "before any KV cache",
            )
        )
    conc = ev.max_concurrency
    if 0 < conc < t.concurrency:
        out.append(
            Advice(
                "--concurrency/--max-num-seqs",
                str(t.concurrency),
                str(conc),
                f"-{t.concurrency - conc}: the KV budget of {_gib(mem.kv_available)} per GPU holds {conc} "
                f"sequences of {t.max_model_len} tokens; the target needs {_gib(-mem.headroom)} more",
            )
        )
    if ev.prompt_image_tokens < t.max_model_len:
        lo = ev.prompt_image_tokens + 1
        best_len = _largest(lambda n: evaluate(m, gpu, t.with_(max_model_len=n), tp).fits, lo, t.max_model_len)
        if best_len:
            out.append(
                Advice(
                    "--max-model-len",
                    str(t.max_model_len),
                    str(best_len),
                    f"-{t.max_model_len - best_len} tokens keeps {t.concurrency} concurrent sequences",
                )
            )
    if ev.kv.dtype_bytes > 1 and evaluate(m, gpu, t.with_(kv_cache_dtype="fp8"), tp).fits:
        out.append(Advice("--kv-cache-dtype", ev.kv.dtype, "fp8", "halves KV bytes per token; check accuracy"))
    if t.gpu_memory_utilization < 0.95:
        util = _smallest_util(m, gpu, t, tp)
        if util is not None:
            out.append(
                Advice(
                    "--gpu-memory-utilization",
                    f"{t.gpu_memory_utilization:.2f}",
                    f"{util:.2f}",
                    f"+{util - t.gpu_memory_utilization:.2f}; leaves {_gib(gpu.memory_bytes * (1 - util))} "
                    "for CUDA graphs / NCCL",
                )
            )
    need_tp = min_tensor_parallel(m, gpu, t)
    if need_tp is not None and need_tp > tp:
        extra = f"; needs --gpu {gpu.name}x{need_tp}" if need_tp > gpu_count else ""
        what = "shards the weights (the MLA latent is replicated)" if m.mla else "shards weights and KV heads"
        out.append(Advice("--tensor-parallel-size", str(tp), str(need_tp), f"{what}{extra}"))
    how = {"fp8": "vLLM --quantization fp8 quantizes online", "int4": "serve an AWQ/GPTQ checkpoint"}
    for dtype, size in (("fp8", 1.0), ("int4", 0.5)):
        if ev.weight_dtype.bytes_per_param > size and evaluate(m, gpu, t.with_(dtype=dtype), tp).fits:
            out.append(Advice("--dtype", ev.weight_dtype.name, dtype, f"{how[dtype]}; check accuracy"))
            break
    if not out:
        out.append(Advice("--gpu", gpu.name, "a larger GPU", "no single knob within range makes this target fit"))
    return out


_TEXT_ROOM = 256  # tokens of text a prompt with images needs at least


def _context_advice(m: ModelShape, gpu: GPUProfile, ev: Evaluation) -> list[Advice]:
    """The images of one prompt fill the context: a longer context (within the model's
    ``max_position_embeddings``), fewer images per prompt, or smaller images — each checked to fit."""
    t, tp = ev.target, ev.tensor_parallel_size
    why = (
        f"{t.images_per_prompt} image(s) × {ev.image_tokens} tokens = {ev.prompt_image_tokens} tokens "
        f"fill the {t.max_model_len}-token context and leave no room for text"
    )
    out: list[Advice] = []
    need = _round_up(ev.prompt_image_tokens + _TEXT_ROOM, 256)
    if need <= m.max_position_embeddings and evaluate(m, gpu, t.with_(max_model_len=need), tp).fits:
        out.append(Advice("--max-model-len", str(t.max_model_len), str(need), why))
    room = t.max_model_len - _TEXT_ROOM
    images = room // ev.image_tokens if ev.image_tokens else 0
    if 0 < images < t.images_per_prompt and evaluate(m, gpu, t.with_(images_per_prompt=images), tp).fits:
        out.append(Advice("--images-per-prompt", str(t.images_per_prompt), str(images), why))
    if m.vision is not None:
        vision = m.vision
        width, height = t.image_size or vision.default_image_size()

        step = vision.patch_size * vision.spatial_merge_size  # sizes the processor does not round

        def ok(k: int) -> bool:
            size = (k * step, max(1, round(k * step * height / width)))
            if vision.image_tokens(size) * t.images_per_prompt > room:
                return False
            return evaluate(m, gpu, t.with_(image_size=size), tp).fits

        best = _largest(ok, 1, width // step) * step
        if best:
            size = f"{best}x{max(1, round(best * height / width))}"
            out.append(Advice("--image-size", f"{width}x{height}", size, f"{why}; keeps the aspect ratio"))
    if not out:
        out.append(
            Advice(
                "--images-per-prompt",
                str(t.images_per_prompt),
                "fewer, smaller images",
                f"{why}, and the model's context is at most {m.max_position_embeddings} tokens",
            )
        )
    return out


def _round_up(n: int, k: int) -> int:
    return math.ceil(n / k) * k


def _largest(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with ok(n), assuming ok is monotone decreasing; 0 if none."""
    if lo > hi or not ok(lo):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _smallest_util(m: ModelShape, gpu: GPUProfile, t: Target, tp: int) -> float | None:
    for step in range(math.ceil(t.gpu_memory_utilization * 100) + 1, 96):
        util = step / 100
        if evaluate(m, gpu, t.with_(gpu_memory_utilization=util), tp).fits:
            return util
    return None
