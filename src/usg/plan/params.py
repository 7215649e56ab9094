"""Parameter counts and weight bytes per dtype.

Counts follow the Hugging Face modelling code layer by layer (embeddings,
attention incl. GQA/MLA, dense or routed MLP, norms, LM head, vision tower and
projector). Weight bytes apply the dtype to the *linear layers of the language
model* only; embeddings, LM head, norms and the vision tower stay in 16-bit, as
AWQ/GPTQ/FP8 checkpoints served by vLLM keep them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from usg.errors import UsageError
from usg.plan.architectures import ModelShape

__all__ = ["DTYPES", "ParamCount", "WeightDType", "count_params", "resolve_dtype", "weight_bytes"]


@dataclass(frozen=True)
class WeightDType:
    """Storage cost of one weight dtype; ``group_size`` adds a per-group scale (and zero point)."""

    name: str
    bytes_per_param: float
    group_size: int = 0
    group_overhead_bytes: float = 0.0  # per group: fp16 scale (+ packed int4 zero point)
    quantized: bool = False

    def bytes_for(self, params: int) -> int:
        data = params * self.bytes_per_param
        if self.group_size:
            data += math.ceil(params / self.group_size) * self.group_overhead_bytes
        return math.ceil(data)


DTYPES: dict[str, WeightDType] = {
    "fp32": WeightDType("fp32", 4.0),
    "bf16": WeightDType("bf16", 2.0),
    "fp16": WeightDType("fp16", 2.0),
    "fp8": WeightDType("fp8", 1.0, quantized=True),  # per-tensor scales: negligible
    # per-output-channel fp16 scale: modelled as one scale per 4096 weights (hidden-size rows)
    "int8": WeightDType("int8", 1.0, group_size=4096, group_overhead_bytes=2.0, quantized=True),
    # AWQ/GPTQ: group 128, fp16 scale + 4-bit zero point per group
    "int4": WeightDType("int4", 0.5, group_size=128, group_overhead_bytes=2.5, quantized=True),
}
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "awq": "int4",
    "gptq": "int4",
}


def resolve_dtype(name: str, *, model: ModelShape | None = None, what: str = "--dtype") -> WeightDType:
    """``auto`` means the checkpoint's ``torch_dtype``, with fp32 served as bf16 (as vLLM does)."""
    key = name.strip().lower()
    if key == "auto":
        key = _ALIASES.get(model.torch_dtype, model.torch_dtype) if model else "bf16"
        if key == "fp32":
            key = "bf16"
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"{what} {name!r} is not a known dtype; fix: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[key]


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part. ``linear`` is what quantization applies to; the rest stays 16-bit."""

    embedding: int
    lm_head: int
    attention: int
    mlp: int  # dense MLPs plus shared experts
    experts: int  # routed experts (all of them)
    router: int
    norms: int
    vision_tower: int
    projector: int
    active_experts: int  # routed expert params one token passes through

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.mlp
            + self.experts
            + self.router
            + self.norms
            + self.vision_tower
            + self.projector
        )

    @property
    def language_model(self) -> int:
        return self.total - self.vision_tower - self.projector

    @property
    def active(self) -> int:
        """Parameters used per token (MoE: only ``experts_per_token`` routed experts)."""
        return self.total - self.experts + self.active_experts

    @property
    def linear(self) -> int:
        return self.attention + self.mlp + self.experts

    def as_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "active": self.active,
            "embedding": self.embedding,
            "lm_head": self.lm_head,
            "attention": self.attention,
            "mlp": self.mlp,
            "experts": self.experts,
            "router": self.router,
            "norms": self.norms,
            "vision_tower": self.vision_tower,
            "projector": self.projector,
        }


def count_params(m: ModelShape) -> ParamCount:
    h = m.hidden_size
    attention = m.num_layers * _attention_params(m)
    mlp = experts = router = active = 0
    norms = m.num_layers * m.norms_per_layer * h + h  # per-layer norms + final norm
    if m.mla is not None:
        extra = m.mla.kv_lora_rank + (m.mla.q_lora_rank or 0)  # kv_a / q_a layernorms
        norms += m.num_layers * extra
        attention -= m.num_layers * extra
    for i in range(m.num_layers):
        if m.moe is not None and m.is_moe_layer(i):
            expert = 3 * h * m.moe.expert_intermediate_size
            experts += m.moe.num_experts * expert
            active += m.moe.experts_per_token * expert
            mlp += 3 * h * m.moe.shared_intermediate_size
            router += h * m.moe.num_experts
        else:
            mlp += 3 * h * m.intermediate_size  # gated MLP: gate, up, down
    embedding = m.vocab_size * h
    vision = m.vision
    return ParamCount(
        embedding=embedding,
        lm_head=0 if m.tie_word_embeddings else embedding,
        attention=attention,
        mlp=mlp,
        experts=experts,
        router=router,
        norms=norms,
        vision_tower=vision.tower_params() if vision else 0,
        projector=vision.projector_params() if vision else 0,
        active_experts=active,
    )


def _attention_params(m: ModelShape) -> int:
    """One layer's attention projections (MLA: including its two internal norms, moved out by the caller)."""
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * m.num_heads * qk
        else:
            q = h * m.num_heads * qk
        kv_a = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        kv_b = a.kv_lora_rank * m.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
        o = m.num_heads * a.v_head_dim * h
        return q + kv_a + kv_b + o
    q_out = m.num_heads * m.head_dim
    kv_out = m.num_kv_heads * m.head_dim
    params = h * (q_out + 2 * kv_out) + q_out * h
    if m.qkv_bias:
        params += q_out + 2 * kv_out
    if m.o_bias:
        params += h
    return params


def weight_bytes(m: ModelShape, dtype: WeightDType, counts: ParamCount | None = None) -> int:
    """Bytes of all weights: ``dtype`` on LM linear layers, 16-bit (or fp32) elsewhere."""
    c = counts or count_params(m)
    rest = c.total - c.linear
    rest_dtype = DTYPES["fp32"] if dtype.name == "fp32" else DTYPES["bf16"]
    return dtype.bytes_for(c.linear) + rest_dtype.bytes_for(rest)
