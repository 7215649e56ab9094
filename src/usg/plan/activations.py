"""Activation / workspace memory of the forward pass that vLLM profiles at start-up.

vLLM runs one dummy forward of ``max_num_batched_tokens`` tokens (and, for
VLMs, one vision-encoder pass over the largest image batch the encoder budget
admits) and reserves the peak. This module estimates that peak per GPU:

* LM forward — per token, the residual stream and its normed copy, plus the
  widest sub-layer output on this rank: fused QKV + attention output, or the
  gated MLP (gate, up, activation; MoE: ``top-k`` copies of the expert
  intermediates plus the permuted hidden state, as the fused-MoE kernel holds).
* Sampler — fp32 logits and probabilities for one row per scheduled sequence.
* Vision — the encoder's peak (see :meth:`VisionShape.encoder_activation_bytes`)
  and the encoder-output cache sized to the encoder budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from usg.plan.architectures import ModelShape

__all__ = ["Activations", "estimate_activations"]


@dataclass(frozen=True)
class Activations:
    lm_forward: int
    sampler: int
    vision_encoder: int
    encoder_cache: int
    images_per_encoder_batch: int

    @property
    def total(self) -> int:
        """LM and encoder run one after the other: the larger one, plus what outlives both."""
        return max(self.lm_forward, self.vision_encoder) + self.sampler + self.encoder_cache

    def as_dict(self) -> dict[str, int]:
        return {
            "lm_forward": self.lm_forward,
            "sampler": self.sampler,
            "vision_encoder": self.vision_encoder,
            "encoder_cache": self.encoder_cache,
            "images_per_encoder_batch": self.images_per_encoder_batch,
            "total": self.total,
        }


def lm_width_per_token(m: ModelShape, tp: int) -> int:
    """Elements live per token at the forward's widest point, on one TP rank."""
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qkv = m.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.kv_lora_rank + a.qk_rope_head_dim
        attn = (qkv + m.num_heads * a.v_head_dim) // tp
    else:
        attn = ((m.num_heads + 2 * m.num_kv_heads) * m.head_dim + m.num_heads * m.head_dim) // tp
    if m.moe is not None:
        moe = m.moe
        mlp = moe.experts_per_token * (3 * moe.expert_intermediate_size // tp + h)
        mlp += 3 * moe.shared_intermediate_size // tp
        mlp = max(mlp, 3 * m.intermediate_size // tp)
    else:
        mlp = 3 * m.intermediate_size // tp
    return 2 * h + max(attn, mlp)


def estimate_activations(
    m: ModelShape,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tensor_parallel_size: int = 1,
    act_bytes: float = 2.0,
    image_tokens: int = 0,
    image_size: tuple[int, int] | None = None,
    images_per_prompt: int = 0,
) -> Activations:
    """Peak activation bytes on one GPU for a step of ``max_num_batched_tokens`` tokens."""
    tokens = max_num_batched_tokens
    lm = math.ceil(tokens * lm_width_per_token(m, tensor_parallel_size) * act_bytes)
    sampler = min(tokens, max_num_seqs) * m.vocab_size * 4 * 2
    vision = cache = images = 0
    if m.vision is not None and images_per_prompt > 0 and image_tokens > 0:
        budget = max(tokens, image_tokens)  # vLLM: encoder budget is at least one image
        images = max(1, min(budget // image_tokens, max_num_seqs * images_per_prompt))
        vision = m.vision.encoder_activation_bytes(image_size, images, act_bytes)
        cache = math.ceil(budget * m.hidden_size * act_bytes)
    return Activations(lm, sampler, vision, cache, images)
