"""The plan: fit, breakdown, vLLM blocks, TP, throughput bounds, settings and advice."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from usg.errors import UsageError
from usg.plan import ModelShape, Target, load_model_config, plan
from usg.plan.hardware import GPU_PROFILES
from usg.plan.memory import evaluate

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"
GIB = 1024**3


def model(name: str) -> ModelShape:
    return load_model_config(RES / f"{name}.json")


def test_llama3_on_l4_16x8192_does_not_fit_and_says_why() -> None:
    m, l4 = model("llama-3-8b"), GPU_PROFILES["L4"]
    p = plan(m, l4, Target(max_model_len=8192, concurrency=16))
    assert not p.fits
    assert p.memory.weights == 2 * 8_030_261_248
    assert p.memory.kv_required == 16 * GIB  # 16 sequences × 8192 tokens × 128 KiB
    assert p.memory.budget == math.floor(l4.memory_bytes * 0.9)
    # vLLM: floor((total × util − weights − activations) / (block × 2 × layers × kv_heads × head_dim × bytes))
    expected_blocks = (p.memory.budget - p.memory.weights - p.memory.activations) // (16 * 2 * 32 * 8 * 128 * 2)
    assert p.kv_blocks == expected_blocks
    assert p.max_concurrency == (p.memory.kv_available // GIB) == 5
    assert p.min_tensor_parallel == 2
    knobs = {a.knob: a for a in p.advice}
    assert knobs["--concurrency/--max-num-seqs"].suggested == "5"
    assert knobs["--tensor-parallel-size"].suggested == "2"
    assert "needs --gpu L4x2" in knobs["--tensor-parallel-size"].detail
    # the settings only promise what fits
    assert ("--max-num-seqs", "5") in p.settings.vllm
    assert dict(p.settings.trtllm)["max_batch_size"] == 5


def test_every_advice_actually_fits() -> None:
    m, l4 = model("llama-3-8b"), GPU_PROFILES["L4"]
    t = Target(max_model_len=8192, concurrency=16)
    p = plan(m, l4, t)
    for a in p.advice:
        if a.knob == "--max-model-len":
            assert evaluate(m, l4, t.with_(max_model_len=int(a.suggested)), 1).fits
            assert not evaluate(m, l4, t.with_(max_model_len=int(a.suggested) + 1), 1).fits
        elif a.knob == "--concurrency/--max-num-seqs":
            assert evaluate(m, l4, t.with_(concurrency=int(a.suggested)), 1).fits
        elif a.knob == "--tensor-parallel-size":
            assert evaluate(m, l4, t, int(a.suggested)).fits


def test_fits_with_headroom_on_h100() -> None:
    p = plan(model("llama-3-8b"), GPU_PROFILES["H100-80GB"], Target(max_model_len=8192, concurrency=16))
    assert p.fits and not p.advice
    assert p.memory.headroom > 0 and p.max_concurrency >= 16
    assert p.max_num_batched_tokens == 8192  # vLLM default on >= 70 GiB parts
    flags = dict(p.settings.vllm)
    assert flags["--max-num-seqs"] == "16" and flags["--max-model-len"] == "8192"
    assert flags["--tensor-parallel-size"] == "1" and flags["--gpu-memory-utilization"] == "0.90"


def test_tensor_parallel_halves_weights_and_kv() -> None:
    m, gpu = model("llama-3-8b"), GPU_PROFILES["L4"]
    t = Target(max_model_len=8192, concurrency=16)
    one, two = plan(m, gpu, t), plan(m, gpu, t, gpu_count=2)
    assert two.tensor_parallel_size == 2 and two.fits
    assert two.memory.weights == one.memory.weights // 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2


def test_mixtral_needs_tensor_parallel_on_h100() -> None:
    p = plan(model("mixtral-8x7b"), GPU_PROFILES["H100-80GB"], Target(max_model_len=4096, concurrency=8))
    assert not p.fits  # 87 GiB of bf16 weights on an 80 GB card
    assert any(a.knob == "weights" for a in p.advice)
    assert p.min_tensor_parallel == 2


def test_sliding_window_raises_concurrency() -> None:
    gpu = GPU_PROFILES["A100-40GB"]
    t = Target(max_model_len=32768, concurrency=1)
    mistral = plan(model("mistral-7b-v0.1"), gpu, t)
    assert mistral.kv_bytes_per_sequence == 4096 * 128 * 1024
    assert mistral.max_concurrency == mistral.memory.kv_available // mistral.kv_bytes_per_sequence


def test_decode_bound_is_bytes_over_bandwidth() -> None:
    gpu = GPU_PROFILES["H100-80GB"]
    p = plan(model("llama-2-7b"), gpu, Target(max_model_len=4096, concurrency=1, dtype="fp16"))
    step_bytes = p.memory.weights + 4096 * 512 * 1024
    assert p.throughput.decode_bytes_per_step == step_bytes
    assert p.throughput.decode_tokens_per_s == pytest.approx(gpu.bandwidth / step_bytes)
    assert 200 < p.throughput.decode_tokens_per_s < 250  # ~14.5 GB per step at 3.35 TB/s
    assert p.throughput.prefill_tokens_per_s == pytest.approx(gpu.bf16_flops / p.throughput.prefill_flops_per_token)


def test_moe_decode_reads_only_routed_experts_at_batch_one() -> None:
    gpu = GPU_PROFILES["H100-80GB"]
    p = plan(model("mixtral-8x7b"), gpu, Target(max_model_len=4096, concurrency=1), gpu_count=2)
    assert p.throughput.decode_bytes_per_step < p.memory.weights / 2  # 2 of 8 experts per layer


def test_vlm_settings_and_image_tokens() -> None:
    m, gpu = model("qwen2-vl-2b-instruct"), GPU_PROFILES["L4"]
    t = Target(max_model_len=8192, concurrency=16, images_per_prompt=2, image_size=(448, 448))
    p = plan(m, gpu, t)
    assert p.fits and p.image_tokens == 256
    flags = dict(p.settings.vllm)
    assert flags["--limit-mm-per-prompt"] == """'{"image": 2}'"""
    assert flags["--mm-processor-kwargs"] == """'{"max_pixels": 200704}'"""
    assert dict(p.settings.trtllm)["max_multimodal_len"] == 16 * 2 * 256
    assert p.activations.vision_encoder > 0


def test_images_that_overflow_the_context_are_reported() -> None:
    m, gpu = model("qwen2-vl-2b-instruct"), GPU_PROFILES["H100-80GB"]
    p = plan(m, gpu, Target(max_model_len=8192, concurrency=1, images_per_prompt=1))  # worst case: 16384
    assert not p.fits and p.max_concurrency == 0
    assert p.advice[0].knob == "--max-model-len" and int(p.advice[0].suggested) > 16384


def test_images_filling_the_whole_model_context_never_suggest_a_longer_context_than_the_model_has() -> None:
    # `usg plan qwen2-vl-2b-instruct.json --gpu A10G --images-per-prompt 2`: 2 × 16384 image tokens fill
    # max_position_embeddings 32768; 63% of memory is free, so the fix is fewer or smaller images
    m, gpu = model("qwen2-vl-2b-instruct"), GPU_PROFILES["A10G"]
    p = plan(m, gpu, Target(max_model_len=m.max_position_embeddings, images_per_prompt=2))
    assert not p.fits and p.memory.headroom > 0.6 * p.memory.total
    knobs = {a.knob: a for a in p.advice}
    assert "--max-model-len" not in knobs  # 33024 would exceed max_position_embeddings 32768
    assert knobs["--images-per-prompt"].suggested == "1"
    width, height = (int(v) for v in knobs["--image-size"].suggested.split("x"))
    assert width == height and width % 28 == 0
    base = Target(max_model_len=m.max_position_embeddings, images_per_prompt=2)
    assert plan(m, gpu, base.with_(images_per_prompt=1)).fits  # every suggestion is one that fits
    assert plan(m, gpu, base.with_(image_size=(width, height))).fits
    assert not plan(m, gpu, base.with_(image_size=(width + 28, height + 28))).fits  # and the largest one


def test_fp8_kv_advice_when_it_is_the_fix() -> None:
    m, gpu = model("llama-3-8b"), GPU_PROFILES["A100-40GB"]
    p = plan(m, gpu, Target(max_model_len=8192, concurrency=30))
    assert not p.fits
    assert any(a.knob == "--kv-cache-dtype" and a.suggested == "fp8" for a in p.advice)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (Target(max_model_len=0), r"--max-model-len 0 must be >= 1"),
        (Target(max_model_len=16384), r"exceeds the model's max_position_embeddings 8192; fix: pass"),
        (Target(max_model_len=4096, concurrency=-2), r"--concurrency -2 must be >= 1"),
        (Target(max_model_len=4096, gpu_memory_utilization=1.5), r"--gpu-memory-utilization 1.5 must be in"),
        (
            Target(max_model_len=4096, images_per_prompt=2),
            r"has no vision tower; fix: drop --images-per-prompt",
        ),
    ],
)
def test_bad_targets(target: Target, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan(model("llama-3-8b"), GPU_PROFILES["L4"], target)


def test_bad_tensor_parallel() -> None:
    m, gpu = model("llama-3-8b"), GPU_PROFILES["L4"]
    with pytest.raises(UsageError, match=r"--tensor-parallel-size 4 exceeds the 2 GPU\(s\) given; fix: pass"):
        plan(m, gpu, Target(max_model_len=4096), gpu_count=2, tensor_parallel_size=4)
    with pytest.raises(UsageError, match=r"tensor parallel size 3 does not divide 32 attention heads"):
        plan(m, gpu, Target(max_model_len=4096), gpu_count=3)


def test_to_dict_is_complete() -> None:
    p = plan(model("gemma-2-9b"), GPU_PROFILES["A100-80GB"], Target(max_model_len=8192, concurrency=32))
    d = p.to_dict()
    assert d["model"]["params"]["total"] == p.params.total
    assert d["model"]["sliding_window_layers"] == 21
    assert d["memory_per_gpu"]["headroom"] == p.memory.headroom
    assert d["settings"]["vllm_command"].startswith("vllm serve")
    assert any("sliding window of 4096" in n for n in d["notes"])
