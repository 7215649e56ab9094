"""Parameter counts vs the published totals, and weight bytes per dtype."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg.errors import UsageError
from usg.plan import count_params, load_model_config, weight_bytes
from usg.plan.params import DTYPES, resolve_dtype

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"

# Published totals (model cards / safetensors index metadata).
PUBLISHED = {
    "llama-2-7b": 6.74e9,
    "llama-3-8b": 8.03e9,
    "mistral-7b-v0.1": 7.24e9,
    "mixtral-8x7b": 46.7e9,
    "gemma-2-9b": 9.24e9,
    "deepseek-v2-lite": 15.7e9,
    "qwen2-vl-2b-instruct": 2.21e9,
    "llava-1.5-7b": 7.06e9,
    "llava-v1.6-mistral-7b": 7.57e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_within_one_percent_of_published(name: str) -> None:
    total = count_params(load_model_config(RES / f"{name}.json")).total
    assert abs(total - PUBLISHED[name]) / PUBLISHED[name] < 0.01


def test_exact_counts_match_the_checkpoints() -> None:
    # Sums of tensor sizes in the published safetensors checkpoints.
    assert count_params(load_model_config(RES / "llama-2-7b.json")).total == 6_738_415_616
    assert count_params(load_model_config(RES / "llama-3-8b.json")).total == 8_030_261_248
    assert count_params(load_model_config(RES / "mixtral-8x7b.json")).total == 46_702_792_704


def test_moe_active_params() -> None:
    mixtral = count_params(load_model_config(RES / "mixtral-8x7b.json"))
    assert abs(mixtral.active - 12.9e9) / 12.9e9 < 0.01  # "12.9B active"
    lite = count_params(load_model_config(RES / "deepseek-v2-lite.json"))
    assert lite.active < lite.total / 5


def test_vlm_split_into_tower_projector_and_lm() -> None:
    c = count_params(load_model_config(RES / "llava-1.5-7b.json"))
    assert abs(c.vision_tower - 303.5e6) < 1e6  # CLIP ViT-L/14-336
    assert c.projector == 1024 * 4096 + 4096 + 4096 * 4096 + 4096
    q = count_params(load_model_config(RES / "qwen2-vl-2b-instruct.json"))
    assert abs(q.language_model - 1.54e9) / 1.54e9 < 0.01
    assert q.lm_head == 0  # tied embeddings


def test_weight_bytes_per_dtype() -> None:
    m = load_model_config(RES / "llama-2-7b.json")
    c = count_params(m)
    assert weight_bytes(m, DTYPES["bf16"]) == 2 * c.total
    assert weight_bytes(m, DTYPES["fp16"]) == 2 * c.total
    assert weight_bytes(m, DTYPES["fp32"]) == 4 * c.total
    rest = c.total - c.linear  # embeddings, LM head and norms stay 16-bit
    assert weight_bytes(m, DTYPES["fp8"]) == c.linear + 2 * rest
    int4 = weight_bytes(m, DTYPES["int4"])
    groups = -(-c.linear // 128)
    assert int4 == -(-(c.linear * 0.5 + groups * 2.5) // 1) + 2 * rest
    assert int4 > c.linear // 2 + 2 * rest  # the group scales are not free
    assert weight_bytes(m, DTYPES["int8"]) > weight_bytes(m, DTYPES["fp8"])


def test_dtype_resolution() -> None:
    gemma = load_model_config(RES / "gemma-2-9b.json")
    assert resolve_dtype("auto", model=gemma).name == "bf16"  # fp32 checkpoints are served in bf16
    assert resolve_dtype("float16").name == "fp16"
    assert resolve_dtype("AWQ").name == "int4"
    with pytest.raises(UsageError, match=r"--dtype 'int3' is not a known dtype; fix: use one of auto, fp32"):
        resolve_dtype("int3")
