"""The per-GPU memory model of one serving target: weights + activations + KV ≤ total × utilization.

:func:`evaluate` is the pure core that :func:`usg.plan.plan` and the advice
search call many times with one knob changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from usg.errors import UsageError
from usg.plan.activations import Activations, estimate_activations
from usg.plan.architectures import ModelShape
from usg.plan.hardware import GPUProfile
from usg.plan.kv import KVCache, kv_cache
from usg.plan.params import ParamCount, WeightDType, count_params, resolve_dtype, weight_bytes

__all__ = ["Evaluation", "MemoryBreakdown", "Target", "evaluate", "valid_tensor_parallel"]

_GIB = 1024**3


@dataclass(frozen=True)
class Target:
    """What the deployment must sustain. ``None`` fields are derived (see :func:`evaluate`)."""

    max_model_len: int
    concurrency: int = 1
    images_per_prompt: int = 0
    image_size: tuple[int, int] | None = None  # (width, height); None = the processor's worst case
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    block_size: int = 16

    def with_(self, **changes: object) -> Target:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU. ``budget = total × utilization``; ``reserve = total − budget``."""

    total: int
    budget: int
    weights: int
    activations: int
    kv_required: int
    reserve: int

    @property
    def kv_available(self) -> int:
        return self.budget - self.weights - self.activations

    @property
    def headroom(self) -> int:
        """Unused budget at the target (negative: the shortfall)."""
        return self.kv_available - self.kv_required

    @property
    def fits(self) -> bool:
        return self.headroom >= 0 and self.kv_available > 0

    def as_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "budget": self.budget,
            "weights": self.weights,
            "activations": self.activations,
            "kv_required": self.kv_required,
            "kv_available": self.kv_available,
            "reserve": self.reserve,
            "headroom": self.headroom,
        }


@dataclass(frozen=True)
class Evaluation:
    target: Target
    tensor_parallel_size: int
    weight_dtype: WeightDType
    params: ParamCount
    kv: KVCache
    memory: MemoryBreakdown
    activations: Activations
    max_num_batched_tokens: int
    image_tokens: int  # per image
    prompt_image_tokens: int  # all images of one prompt

    @property
    def kv_bytes_per_sequence(self) -> int:
        return self.kv.bytes_per_sequence(self.target.max_model_len)

    @property
    def max_concurrency(self) -> int:
        if self.prompt_image_tokens >= self.target.max_model_len:
            return 0
        return self.kv.sequences_for(self.memory.kv_available, self.target.max_model_len)

    @property
    def kv_blocks(self) -> int:
        return self.kv.blocks_for(self.memory.kv_available)

    @property
    def fits(self) -> bool:
        return self.memory.fits and self.max_concurrency >= self.target.concurrency


def valid_tensor_parallel(m: ModelShape, tp: int) -> bool:
    """vLLM shards attention heads: TP must divide the heads; KV heads split or replicate evenly."""
    kv = m.num_kv_heads
    return tp >= 1 and m.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def check_target(m: ModelShape, t: Target) -> None:
    """Reject impossible inputs with the flag, the value and the fix."""
    if t.max_model_len < 1:
        raise UsageError(f"--max-model-len {t.max_model_len} must be >= 1; fix: pass the longest prompt+output")
    if t.max_model_len > m.max_position_embeddings:
        raise UsageError(
            f"--max-model-len {t.max_model_len} exceeds the model's max_position_embeddings "
            f"{m.max_position_embeddings}; fix: pass --max-model-len {m.max_position_embeddings} or less"
        )
    if t.concurrency < 1:
        raise UsageError(f"--concurrency {t.concurrency} must be >= 1; fix: pass the number of parallel requests")
    if t.images_per_prompt < 0:
        raise UsageError(f"--images-per-prompt {t.images_per_prompt} is negative; fix: pass 0 or more")
    if t.images_per_prompt and m.vision is None:
        raise UsageError(
            f"--images-per-prompt {t.images_per_prompt} given, but {m.name} ({m.model_type}) has no vision "
            "tower; fix: drop --images-per-prompt or pass a VLM config (llava, llava_next, qwen2_vl)"
        )
    if not 0 < t.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization {t.gpu_memory_utilization} must be in (0, 1]; fix: use e.g. 0.9")
    if t.max_num_batched_tokens is not None and t.max_num_batched_tokens < 1:
        raise UsageError(f"--max-num-batched-tokens {t.max_num_batched_tokens} must be >= 1; fix: use e.g. 8192")


def default_batched_tokens(gpu: GPUProfile, t: Target, image_tokens: int) -> int:
    """vLLM V1's online-serving default (8192 on >= 70 GiB parts, 2048 below), >= one image, >= seqs."""
    if t.max_num_batched_tokens is not None:
        return t.max_num_batched_tokens
    base = 8192 if gpu.memory_bytes >= 70 * _GIB else 2048
    return max(base, image_tokens, t.concurrency)


def evaluate(m: ModelShape, gpu: GPUProfile, t: Target, tp: int) -> Evaluation:
    wdtype = resolve_dtype(t.dtype, model=m)
    kv_name = t.kv_cache_dtype.strip().lower()
    if kv_name == "auto":
        kv_name = "fp32" if wdtype.name == "fp32" else resolve_dtype("auto", model=m).name
    kv = kv_cache(m, kv_name, tensor_parallel_size=tp, block_size=t.block_size)
    counts = count_params(m)
    image_tokens = m.vision.image_tokens(t.image_size) if m.vision and t.images_per_prompt else 0
    tokens = default_batched_tokens(gpu, t, image_tokens)
    act_bytes = 4.0 if wdtype.name == "fp32" else 2.0
    acts = estimate_activations(
        m,
        max_num_batched_tokens=tokens,
        max_num_seqs=t.concurrency,
        tensor_parallel_size=tp,
        act_bytes=act_bytes,
        image_tokens=image_tokens,
        image_size=t.image_size,
        images_per_prompt=t.images_per_prompt,
    )
    budget = math.floor(gpu.memory_bytes * t.gpu_memory_utilization)
    memory = MemoryBreakdown(
        total=gpu.memory_bytes,
        budget=budget,
        weights=math.ceil(weight_bytes(m, wdtype, counts) / tp),
        activations=acts.total,
        kv_required=t.concurrency * kv.bytes_per_sequence(t.max_model_len),
        reserve=gpu.memory_bytes - budget,
    )
    return Evaluation(
        target=t,
        tensor_parallel_size=tp,
        weight_dtype=wdtype,
        params=counts,
        kv=kv,
        memory=memory,
        activations=acts,
        max_num_batched_tokens=tokens,
        image_tokens=image_tokens,
        prompt_image_tokens=image_tokens * t.images_per_prompt,
    )
