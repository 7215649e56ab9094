"""Roofline bounds: decode from memory bandwidth, prefill from dense BF16 FLOP/s.

Both are *upper bounds* on throughput (lower bounds on latency): real engines
reach roughly 50–80% of them. Per decode step each GPU reads its share of the
weights (MoE: only the experts the batch routes to, in expectation) plus the
KV cache of every running sequence; per prefill token the model does
``2 × active matmul params`` FLOPs plus causal attention over the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from usg.plan.architectures import ModelShape
from usg.plan.params import ParamCount, WeightDType

__all__ = ["Throughput", "estimate_throughput"]


@dataclass(frozen=True)
class Throughput:
    concurrency: int
    context_len: int
    decode_bytes_per_step: int  # per GPU
    decode_step_ms: float
    decode_tokens_per_s: float  # all sequences together
    decode_tokens_per_s_per_seq: float
    prefill_flops_per_token: float
    prefill_tokens_per_s: float
    ttft_ms: float  # one full-length prompt (with its images) on an idle engine

    def as_dict(self) -> dict[str, float | int]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts touched when ``tokens`` tokens each route to ``top_k`` of ``num_experts``."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def estimate_throughput(
    m: ModelShape,
    counts: ParamCount,
    dtype: WeightDType,
    *,
    weight_bytes_per_gpu: int,
    kv_bytes_per_seq: int,
    concurrency: int,
    context_len: int,
    tensor_parallel_size: int,
    bandwidth: float,
    flops: float,
    vision_flops_per_prompt: float = 0.0,
) -> Throughput:
    tp = tensor_parallel_size
    batch = max(1, concurrency)
    weights = float(weight_bytes_per_gpu)
    if m.moe is not None and counts.experts:
        expert_bytes = dtype.bytes_for(counts.experts) / tp
        touched = expected_experts(m.moe.num_experts, m.moe.experts_per_token, batch) / m.moe.num_experts
        weights -= expert_bytes * (1.0 - touched)
    weights -= (counts.vision_tower + counts.projector) * 2 / tp  # the tower is idle while decoding
    step_bytes = int(weights + batch * kv_bytes_per_seq)
    step_s = step_bytes / bandwidth
    matmul = counts.active - counts.embedding - counts.vision_tower - counts.projector
    attn_dim = m.num_heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim if m.mla else m.head_dim)
    # QK^T and PV over on average half the prompt (causal); sliding layers see at most their window.
    attn = sum(4 * attn_dim * min(context_len, w or context_len) / 2 for w in _windows(m))
    per_token = 2.0 * matmul + attn
    cluster_flops = flops * tp
    prefill_s = (per_token * context_len + vision_flops_per_prompt) / cluster_flops
    return Throughput(
        concurrency=batch,
        context_len=context_len,
        decode_bytes_per_step=step_bytes,
        decode_step_ms=step_s * 1e3,
        decode_tokens_per_s=batch / step_s,
        decode_tokens_per_s_per_seq=1.0 / step_s,
        prefill_flops_per_token=per_token,
        prefill_tokens_per_s=cluster_flops / per_token,
        ttft_ms=prefill_s * 1e3,
    )


def _windows(m: ModelShape) -> tuple[int | None, ...]:
    return m.layer_windows or (None,) * m.num_layers
