"""config.json → ModelShape on the real published configs, and clear errors on bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from usg.errors import InputError, UsageError
from usg.plan import ModelShape, load_model_config

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"


def load(name: str) -> ModelShape:
    return load_model_config(RES / f"{name}.json")


def test_llama3_gqa_shape() -> None:
    m = load("llama-3-8b")
    assert (m.model_type, m.num_layers, m.hidden_size) == ("llama", 32, 4096)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (32, 8, 128)
    assert m.vocab_size == 128256 and not m.tie_word_embeddings
    assert m.layer_windows == (None,) * 32 and m.moe is None and m.mla is None and m.vision is None
    assert m.name == "llama-3-8b"


def test_mistral_sliding_window_on_every_layer() -> None:
    m = load("mistral-7b-v0.1")
    assert m.layer_windows == (4096,) * 32
    assert m.sliding_layers == 32


def test_gemma2_alternates_local_and_global_layers_with_explicit_head_dim() -> None:
    m = load("gemma-2-9b")
    assert m.head_dim == 256 and m.num_heads * m.head_dim != m.hidden_size
    assert m.layer_windows[:4] == (4096, None, 4096, None)
    assert m.sliding_layers == 21
    assert m.tie_word_embeddings and m.norms_per_layer == 4


def test_mixtral_moe_and_null_sliding_window() -> None:
    m = load("mixtral-8x7b")
    assert m.moe is not None
    assert (m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_intermediate_size) == (8, 2, 14336)
    assert m.sliding_layers == 0
    assert all(m.is_moe_layer(i) for i in range(32))


def test_deepseek_v2_lite_mla_and_dense_first_layer() -> None:
    m = load("deepseek-v2-lite")
    assert m.mla is not None and m.moe is not None
    assert m.mla.latent_size == 512 + 64 and m.mla.q_lora_rank is None
    assert not m.is_moe_layer(0) and m.is_moe_layer(1)
    assert m.moe.shared_intermediate_size == 2 * 1408


def test_qwen2_vl_respects_use_sliding_window_false() -> None:
    m = load("qwen2-vl-2b-instruct")
    assert m.sliding_layers == 0  # sliding_window 32768 is set, but use_sliding_window is false
    assert m.vision is not None and m.vision.kind == "qwen2_vl"
    assert m.qkv_bias and m.tie_word_embeddings and (m.num_kv_heads, m.head_dim) == (2, 128)


def test_llava_applies_transformers_defaults_and_says_so() -> None:
    m = load("llava-1.5-7b")
    assert (m.num_layers, m.hidden_size, m.intermediate_size, m.num_kv_heads) == (32, 4096, 11008, 32)
    assert m.vocab_size == 32064 and m.torch_dtype == "float16"
    assert "default text_config.hidden_size=4096" in m.assumptions
    assert m.vision is not None and (m.vision.image_size, m.vision.patch_size) == (336, 14)


def test_llava_next_is_mistral_without_window_and_top_level_dtype() -> None:
    m = load("llava-v1.6-mistral-7b")
    assert m.sliding_layers == 0 and m.num_kv_heads == 8 and m.intermediate_size == 14336
    assert m.torch_dtype == "float16"
    assert m.vision is not None and len(m.vision.grid_pinpoints) == 5 and m.vision.image_newline


def test_directory_holding_config_json(tmp_path: Path) -> None:
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text((RES / "llama-3-8b.json").read_text())
    m = load_model_config(d)
    assert m.name == "Meta-Llama-3-8B" and m.num_kv_heads == 8


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return p


def _llama() -> dict[str, object]:
    return json.loads((RES / "llama-3-8b.json").read_text())


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = _llama()
    del data["num_hidden_layers"]
    with pytest.raises(InputError, match=r"required field 'num_hidden_layers' is missing; fix: copy"):
        load_model_config(_write(tmp_path, data))


def test_negative_field_names_value_and_fix(tmp_path: Path) -> None:
    data = _llama()
    data["hidden_size"] = -4096
    with pytest.raises(InputError, match=r"field 'hidden_size' must be >= 1 \(got -4096\); fix:"):
        load_model_config(_write(tmp_path, data))


def test_non_integer_field(tmp_path: Path) -> None:
    data = _llama()
    data["num_attention_heads"] = "32"
    with pytest.raises(InputError, match=r"'num_attention_heads' must be an integer \(got '32'\)"):
        load_model_config(_write(tmp_path, data))


def test_kv_heads_must_divide_heads(tmp_path: Path) -> None:
    data = _llama()
    data["num_key_value_heads"] = 5
    with pytest.raises(InputError, match=r"'num_key_value_heads' must divide num_attention_heads=32"):
        load_model_config(_write(tmp_path, data))


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    data = {"model_type": "falcon", "architectures": ["FalconForCausalLM"]}
    with pytest.raises(InputError, match=r"unknown architecture model_type='falcon'.*supported: deepseek_v2"):
        load_model_config(_write(tmp_path, data))


def test_nested_field_path_is_named(tmp_path: Path) -> None:
    data = json.loads((RES / "qwen2-vl-2b-instruct.json").read_text())
    del data["vision_config"]["depth"]
    with pytest.raises(InputError, match=r"'vision_config\.depth' is missing"):
        load_model_config(_write(tmp_path, data))


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"does not exist; fix: pass a Hugging Face config.json"):
        load_model_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"cannot read as JSON"):
        load_model_config(bad)
    with pytest.raises(InputError, match=r"top level is list"):
        load_model_config(_write(tmp_path, [1, 2]))
