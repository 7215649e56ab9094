"""KV bytes per token / sequence / block against known figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg.errors import UsageError
from usg.plan import ModelShape, kv_cache, load_model_config

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"
KIB, MIB = 1024, 1024**2


def model(name: str) -> ModelShape:
    return load_model_config(RES / f"{name}.json")


def test_llama2_7b_fp16_kv_is_512_kib_per_token() -> None:
    assert kv_cache(model("llama-2-7b"), "fp16").bytes_per_token == 512 * KIB


def test_llama3_8b_gqa_kv_is_128_kib_per_token() -> None:
    kv = kv_cache(model("llama-3-8b"), "bf16")
    assert kv.bytes_per_token == 128 * KIB
    assert kv.bytes_per_sequence(8192) == 1024 * MIB
    assert kv_cache(model("llama-3-8b"), "fp8").bytes_per_token == 64 * KIB


def test_mistral_sliding_window_caps_kv_per_sequence() -> None:
    kv = kv_cache(model("mistral-7b-v0.1"), "bf16")
    assert kv.bytes_per_token == 128 * KIB
    assert kv.bytes_per_sequence(4096) == 4096 * 128 * KIB
    assert kv.bytes_per_sequence(32768) == 4096 * 128 * KIB  # capped at the 4096 window
    assert kv.bytes_per_sequence(1000) == 1008 * 128 * KIB  # rounded up to 16-token blocks


def test_gemma2_caps_only_the_sliding_layers() -> None:
    kv = kv_cache(model("gemma-2-9b"), "bf16")
    per_layer = 2 * 8 * 256 * 2
    assert kv.bytes_per_token == 42 * per_layer  # 336 KiB
    assert kv.bytes_per_sequence(8192) == 21 * per_layer * 4096 + 21 * per_layer * 8192


def test_deepseek_mla_caches_the_latent_and_is_not_sharded() -> None:
    m = model("deepseek-v2-lite")
    assert kv_cache(m, "bf16").bytes_per_token == 27 * (512 + 64) * 2
    assert kv_cache(m, "bf16", tensor_parallel_size=4).bytes_per_token == 27 * (512 + 64) * 2


def test_tensor_parallel_shards_and_replicates_kv_heads() -> None:
    m = model("llama-3-8b")
    assert kv_cache(m, "bf16", tensor_parallel_size=2).bytes_per_token == 64 * KIB
    assert kv_cache(m, "bf16", tensor_parallel_size=8).bytes_per_token == 16 * KIB
    # 8 KV heads on 16 ranks: one head per rank, replicated
    assert kv_cache(m, "bf16", tensor_parallel_size=16).kv_heads_per_rank == 1


def test_vllm_block_formula() -> None:
    kv = kv_cache(model("llama-3-8b"), "bf16")
    assert kv.bytes_per_block == 16 * 2 * 32 * 8 * 128 * 2
    assert kv.blocks_for(10 * 1024**3) == (10 * 1024**3) // (16 * 128 * KIB)
    assert kv.blocks_for(-5) == 0


def test_bad_kv_arguments() -> None:
    m = model("llama-3-8b")
    with pytest.raises(UsageError, match=r"--kv-cache-dtype 'int2' is not supported; fix: use auto or one of"):
        kv_cache(m, "int2")
    with pytest.raises(UsageError, match=r"--block-size 0 must be >= 1"):
        kv_cache(m, "bf16", block_size=0)
    with pytest.raises(UsageError, match=r"sequence length -1 is negative"):
        kv_cache(m, "bf16").bytes_per_sequence(-1)
