"""KV-cache size: per token, per sequence (sliding windows capped), per block, under tensor parallelism.

Standard attention caches ``2 (K and V) × kv_heads × head_dim`` elements per
layer per token; DeepSeek MLA caches one latent of ``kv_lora_rank +
qk_rope_head_dim`` elements per layer per token, replicated on every
tensor-parallel rank (vLLM does not shard it). KV heads are split across TP
ranks, and replicated when there are fewer KV heads than ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from usg.errors import UsageError
from usg.plan.architectures import ModelShape

__all__ = ["KV_DTYPE_BYTES", "KVCache", "kv_cache"]

KV_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}


@dataclass(frozen=True)
class KVCache:
    """The KV-cache geometry of one model on one tensor-parallel rank."""

    model: ModelShape
    dtype: str
    dtype_bytes: float
    tensor_parallel_size: int = 1
    block_size: int = 16

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.model.num_kv_heads // self.tensor_parallel_size)

    @property
    def elements_per_token_per_layer(self) -> int:
        if self.model.mla is not None:
            return self.model.mla.latent_size
        return 2 * self.kv_heads_per_rank * self.model.head_dim

    @property
    def bytes_per_token_per_layer(self) -> float:
        return self.elements_per_token_per_layer * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """``2 × layers × kv_heads × head_dim × dtype bytes`` (per rank), windows not applied."""
        return math.ceil(self.model.num_layers * self.bytes_per_token_per_layer)

    @property
    def bytes_per_block(self) -> int:
        """One vLLM block (``block_size`` tokens, all layers) — the unit of the block formula."""
        return self.block_size * self.bytes_per_token

    def tokens_cached(self, seq_len: int) -> list[int]:
        """Tokens each layer holds for a sequence of ``seq_len``: capped at its window, rounded to blocks."""
        out = []
        for window in self.model.layer_windows or (None,) * self.model.num_layers:
            n = seq_len if window is None else min(seq_len, window)
            out.append(math.ceil(n / self.block_size) * self.block_size)
        return out

    def bytes_per_sequence(self, seq_len: int) -> int:
        """KV bytes one sequence of ``seq_len`` tokens pins (sliding-window layers capped at the window)."""
        if seq_len < 0:
            raise UsageError(f"sequence length {seq_len} is negative; fix: pass a positive length")
        return math.ceil(sum(self.tokens_cached(seq_len)) * self.bytes_per_token_per_layer)

    def blocks_for(self, kv_budget_bytes: float) -> int:
        """vLLM's ``num_gpu_blocks``: ``floor(budget / (block × per-token KV))`` (0 when negative)."""
        return max(0, math.floor(kv_budget_bytes / self.bytes_per_block))

    def sequences_for(self, kv_budget_bytes: float, seq_len: int) -> int:
        """How many sequences of ``seq_len`` tokens fit in ``kv_budget_bytes`` at the same time."""
        per_seq = self.bytes_per_sequence(seq_len)
        return max(0, math.floor(kv_budget_bytes / per_seq)) if per_seq else 0


def kv_cache(model: ModelShape, dtype: str = "bf16", *, tensor_parallel_size: int = 1, block_size: int = 16) -> KVCache:
    """The :class:`KVCache` of ``model`` with a KV dtype (``bf16``, ``fp16``, ``fp8``, ``fp32``)."""
    key = dtype.strip().lower()
    if key not in KV_DTYPE_BYTES:
        raise UsageError(
            f"--kv-cache-dtype {dtype!r} is not supported; fix: use auto or one of {', '.join(KV_DTYPE_BYTES)}"
        )
    if tensor_parallel_size < 1:
        raise UsageError(f"tensor parallel size {tensor_parallel_size} must be >= 1; fix: pass 1, 2, 4 or 8")
    if block_size < 1:
        raise UsageError(f"--block-size {block_size} must be >= 1; fix: use 16 (the vLLM default)")
    return KVCache(model, key, KV_DTYPE_BYTES[key], tensor_parallel_size, block_size)
