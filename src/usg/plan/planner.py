"""The plan: does a model fit a GPU at a target, with what settings, and what to change if not.

:func:`plan` is pure: config + hardware + target in, a frozen :class:`Plan` out.
All figures are per GPU unless named otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from usg.errors import UsageError
from usg.plan.activations import Activations
from usg.plan.advice import Advice, advise, min_tensor_parallel
from usg.plan.architectures import ModelShape
from usg.plan.hardware import GPUProfile
from usg.plan.memory import Evaluation, MemoryBreakdown, Target, check_target, evaluate, valid_tensor_parallel
from usg.plan.params import ParamCount
from usg.plan.throughput import Throughput, estimate_throughput

__all__ = ["Plan", "Settings", "plan"]


@dataclass(frozen=True)
class Settings:
    """Ready-to-paste engine settings for the plan."""

    vllm: tuple[tuple[str, str], ...]  # (flag, value) pairs
    trtllm: tuple[tuple[str, int], ...]  # Triton / TensorRT-LLM build limits

    def vllm_command(self, model: str = "MODEL") -> str:
        return " ".join(["vllm serve", model, *(f"{k} {v}" for k, v in self.vllm)])

    def as_dict(self) -> dict[str, Any]:
        return {"vllm": dict(self.vllm), "vllm_command": self.vllm_command(), "trtllm": dict(self.trtllm)}


@dataclass(frozen=True)
class Plan:
    """The answer of :func:`plan`. ``memory`` is per GPU; ``max_concurrency`` at ``max_model_len``."""

    model: ModelShape
    gpu: GPUProfile
    gpu_count: int
    tensor_parallel_size: int
    target: Target
    weight_dtype: str
    kv_cache_dtype: str
    params: ParamCount
    weight_bytes: int  # all GPUs together
    kv_bytes_per_token: int  # per GPU (KV heads sharded by TP)
    kv_bytes_per_sequence: int  # per GPU, at max_model_len, sliding windows capped
    image_tokens: int  # per image
    memory: MemoryBreakdown
    activations: Activations
    max_num_batched_tokens: int
    fits: bool
    max_concurrency: int
    kv_blocks: int
    min_tensor_parallel: int | None
    throughput: Throughput
    settings: Settings
    advice: tuple[Advice, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "model": {
                "name": self.model.name,
                "model_type": self.model.model_type,
                "params": self.params.as_dict(),
                "weight_dtype": self.weight_dtype,
                "weight_bytes": self.weight_bytes,
                "kv_cache_dtype": self.kv_cache_dtype,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
                "image_tokens": self.image_tokens,
                "sliding_window_layers": self.model.sliding_layers,
            },
            "gpu": {**self.gpu.as_dict(), "count": self.gpu_count},
            "target": {
                "max_model_len": t.max_model_len,
                "concurrency": t.concurrency,
                "images_per_prompt": t.images_per_prompt,
                "image_size": list(t.image_size) if t.image_size else None,
                "gpu_memory_utilization": t.gpu_memory_utilization,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "block_size": t.block_size,
            },
            "tensor_parallel_size": self.tensor_parallel_size,
            "fits": self.fits,
            "memory_per_gpu": self.memory.as_dict(),
            "activations": self.activations.as_dict(),
            "max_concurrency": self.max_concurrency,
            "kv_blocks": self.kv_blocks,
            "min_tensor_parallel": self.min_tensor_parallel,
            "throughput": self.throughput.as_dict(),
            "settings": self.settings.as_dict(),
            "advice": [a.as_dict() for a in self.advice],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plan(
    model: ModelShape,
    gpu: GPUProfile,
    target: Target,
    *,
    gpu_count: int = 1,
    tensor_parallel_size: int | None = None,
) -> Plan:
    """Plan ``model`` on ``gpu_count`` × ``gpu`` for ``target`` (TP defaults to all GPUs)."""
    check_target(model, target)
    if gpu_count < 1:
        raise UsageError(f"GPU count {gpu_count} must be >= 1; fix: write --gpu NAMExN with N >= 1")
    tp = gpu_count if tensor_parallel_size is None else tensor_parallel_size
    if tp > gpu_count:
        raise UsageError(
            f"--tensor-parallel-size {tp} exceeds the {gpu_count} GPU(s) given; fix: pass --gpu {gpu.name}x{tp}"
        )
    if not valid_tensor_parallel(model, tp):
        options = [n for n in (1, 2, 4, 8, 16) if valid_tensor_parallel(model, n)]
        raise UsageError(
            f"tensor parallel size {tp} does not divide {model.num_heads} attention heads / "
            f"{model.num_kv_heads} KV heads of {model.name}; fix: use one of {options}"
        )
    ev = evaluate(model, gpu, target, tp)
    conc = min(target.concurrency, ev.max_concurrency) or target.concurrency
    vision_flops = 0.0
    if model.vision is not None and target.images_per_prompt:
        per_image = model.vision.encoder_tokens(target.image_size)
        vision_flops = 2.0 * ev.params.vision_tower * per_image * target.images_per_prompt
    throughput = estimate_throughput(
        model,
        ev.params,
        ev.weight_dtype,
        weight_bytes_per_gpu=ev.memory.weights,
        kv_bytes_per_seq=ev.kv_bytes_per_sequence,
        concurrency=conc,
        context_len=target.max_model_len,
        tensor_parallel_size=tp,
        bandwidth=gpu.bandwidth,
        flops=gpu.bf16_flops,
        vision_flops_per_prompt=vision_flops,
    )
    return Plan(
        model=model,
        gpu=gpu,
        gpu_count=gpu_count,
        tensor_parallel_size=tp,
        target=target,
        weight_dtype=ev.weight_dtype.name,
        kv_cache_dtype=ev.kv.dtype,
        params=ev.params,
        weight_bytes=ev.memory.weights * tp,
        kv_bytes_per_token=ev.kv.bytes_per_token,
        kv_bytes_per_sequence=ev.kv_bytes_per_sequence,
        image_tokens=ev.image_tokens,
        memory=ev.memory,
        activations=ev.activations,
        max_num_batched_tokens=ev.max_num_batched_tokens,
        fits=ev.fits,
        max_concurrency=ev.max_concurrency,
        kv_blocks=ev.kv_blocks,
        min_tensor_parallel=min_tensor_parallel(model, gpu, target),
        throughput=throughput,
        settings=_settings(model, ev, conc),
        advice=tuple(advise(model, gpu, ev, gpu_count)),
        notes=_notes(model, gpu, ev, gpu_count),
    )


def memory_curve(
    model: ModelShape, gpu: GPUProfile, target: Target, tp: int, points: int = 40
) -> list[tuple[int, int]]:
    """(concurrency, bytes needed per GPU) from 1 to past the fit point, for plotting."""
    ev = evaluate(model, gpu, target, tp)
    top = max(target.concurrency, ev.max_concurrency, 1) * 5 // 4 + 1
    step = max(1, top // points)
    out = []
    for c in range(1, top + 1, step):
        m = evaluate(model, gpu, target.with_(concurrency=c), tp).memory
        out.append((c, m.weights + m.activations + m.kv_required))
    return out


def _settings(m: ModelShape, ev: Evaluation, seqs: int) -> Settings:
    t = ev.target
    vllm: list[tuple[str, str]] = [
        ("--gpu-memory-utilization", f"{t.gpu_memory_utilization:.2f}"),
        ("--max-model-len", str(t.max_model_len)),
        ("--max-num-seqs", str(seqs)),
        ("--max-num-batched-tokens", str(ev.max_num_batched_tokens)),
        ("--tensor-parallel-size", str(ev.tensor_parallel_size)),
    ]
    if t.block_size != 16:
        vllm.append(("--block-size", str(t.block_size)))
    if ev.weight_dtype.name in ("bf16", "fp16", "fp32"):
        vllm.append(("--dtype", {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[ev.weight_dtype.name]))
    elif ev.weight_dtype.name == "fp8":
        vllm.append(("--quantization", "fp8"))
    if ev.kv.dtype.startswith("fp8"):
        vllm.append(("--kv-cache-dtype", "fp8"))
    trt: list[tuple[str, int]] = [
        ("max_batch_size", seqs),
        ("max_seq_len", t.max_model_len),
        ("max_num_tokens", ev.max_num_batched_tokens),
        ("max_input_len", t.max_model_len),
    ]
    if m.vision is not None:
        vllm.append(("--limit-mm-per-prompt", f"'{json.dumps({'image': t.images_per_prompt})}'"))
        if m.vision.kind == "qwen2_vl" and t.image_size is not None and t.images_per_prompt:
            gh, gw = m.vision._qwen_grid(t.image_size[1], t.image_size[0])
            pixels = gh * gw * m.vision.patch_size**2
            vllm.append(("--mm-processor-kwargs", f"'{json.dumps({'max_pixels': pixels})}'"))
        trt.append(("max_multimodal_len", seqs * ev.prompt_image_tokens))
    return Settings(tuple(vllm), tuple(trt))


def _notes(m: ModelShape, gpu: GPUProfile, ev: Evaluation, gpu_count: int) -> tuple[str, ...]:
    t, notes = ev.target, list(m.assumptions)
    if t.dtype == "auto":
        notes.append(f"weights dtype auto → {ev.weight_dtype.name} (config torch_dtype={m.torch_dtype})")
    if ev.weight_dtype.name in ("int4", "int8"):
        notes.append(
            f"{ev.weight_dtype.name} weights: serve a quantized checkpoint (AWQ/GPTQ/compressed-tensors); "
            "vLLM reads the method from it, and keeps embeddings, LM head and vision tower in 16-bit"
        )
    if m.sliding_layers:
        windows = sorted({w for w in m.layer_windows if w is not None})
        notes.append(
            f"{m.sliding_layers}/{m.num_layers} layers use a sliding window of {windows[0]} tokens: "
            "their KV is capped at the window"
        )
    if m.mla is not None:
        notes.append(
            f"MLA: KV holds one {m.mla.latent_size}-element latent per layer per token, replicated on each TP rank"
        )
    if m.vision is not None and t.images_per_prompt:
        size = t.image_size or m.vision.default_image_size()
        how = "given" if t.image_size else "worst case the processor allows; pass --image-size to plan for yours"
        notes.append(f"image {size[0]}x{size[1]} ({how}) → {ev.image_tokens} tokens per image")
    if gpu_count > ev.tensor_parallel_size:
        notes.append(f"{gpu_count // ev.tensor_parallel_size} data-parallel replicas of TP={ev.tensor_parallel_size}")
    if gpu.note:
        notes.append(f"{gpu.name}: {gpu.note}")
    notes.append(
        "throughput figures are roofline upper bounds (memory bandwidth for decode, dense BF16 FLOP/s for "
        "prefill); expect 50-80% of them"
    )
    notes.append("CUDA graphs, NCCL buffers and the CUDA context must fit in the reserve (1 - utilization)")
    return tuple(notes)
