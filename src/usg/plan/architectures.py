"""Hugging Face ``config.json`` → :class:`ModelShape`, the one view the planner reads.

Supported ``model_type`` values: ``llama``, ``mistral``, ``qwen2``, ``gemma``,
``gemma2``, ``mixtral``, ``deepseek_v2``, ``deepseek_v3`` and the VLMs ``llava``,
``llava_next`` (CLIP tower + MLP projector + LM in ``text_config``) and
``qwen2_vl`` (ViT + patch merger + Qwen2 LM).

Nested ``text_config`` / ``vision_config`` objects in LLaVA checkpoints only
store fields that differ from the transformers defaults; those defaults are
applied and listed in :attr:`ModelShape.assumptions`. Top-level fields are
never guessed: a missing one is a :class:`usg.errors.InputError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from usg.errors import InputError, UsageError
from usg.plan._fields import Fields
from usg.plan.vision import VisionShape, parse_vision
from usg.yaml_bounded import read_bounded_text

__all__ = ["SUPPORTED_MODEL_TYPES", "MLAShape", "MoEShape", "ModelShape", "load_model_config"]

_DECODERS = ("llama", "mistral", "qwen2", "gemma", "gemma2", "mixtral", "deepseek_v2", "deepseek_v3")
_VLMS = ("llava", "llava_next", "qwen2_vl")
SUPPORTED_MODEL_TYPES = tuple(sorted(_DECODERS + _VLMS))

# transformers LlamaConfig / MistralConfig defaults, for LLaVA text_config objects.
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
    },
}


@dataclass(frozen=True)
class MoEShape:
    """Routed experts (and DeepSeek's always-on shared experts) of a mixture-of-experts LM."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0  # width of the shared-expert MLP (n_shared × moe width)
    first_dense_layers: int = 0  # DeepSeek first_k_dense_replace
    layer_freq: int = 1


@dataclass(frozen=True)
class MLAShape:
    """DeepSeek multi-head latent attention: the KV cache holds one latent per token per layer."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def latent_size(self) -> int:
        """Elements cached per token per layer: the compressed KV plus the decoupled RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelShape:
    """Everything about a model's structure that memory, KV and throughput depend on."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    norms_per_layer: int = 2
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window, or None for global attention
    moe: MoEShape | None = None
    mla: MLAShape | None = None
    vision: VisionShape | None = None
    torch_dtype: str = "bfloat16"
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_vlm(self) -> bool:
        return self.vision is not None

    def is_moe_layer(self, index: int) -> bool:
        moe = self.moe
        return moe is not None and index >= moe.first_dense_layers and index % moe.layer_freq == 0

    @property
    def sliding_layers(self) -> int:
        return sum(1 for w in self.layer_windows if w is not None)


_MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a published config.json is a few KiB


def _config_int(text: str) -> int:
    """json's parse_int: an integer of more than 100 digits is refused before int() (4300+ is a bare ValueError)."""
    if len(text) > 100:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def load_model_config(source: str | Path | Mapping[str, Any]) -> ModelShape:
    """Read a ``config.json`` (a file, a directory holding one, or the parsed dict)."""
    if isinstance(source, Mapping):
        return model_shape_from_dict(source, source_name="config")
    path = Path(source)
    name = path.name
    if path.is_dir():
        path = path / "config.json"
    elif path.name == "config.json":
        name = path.parent.name or path.stem
    else:
        name = path.stem
    if not path.is_file():
        raise UsageError(
            f"model config {str(source)!r} does not exist; "
            "fix: pass a Hugging Face config.json or the model directory that contains one"
        )
    try:
        data = json.loads(read_bounded_text(path, _MAX_CONFIG_BYTES), parse_int=_config_int)
    except RecursionError:
        raise InputError(
            f"{path}: cannot read as JSON (nested too deeply); fix: pass the model's config.json"
        ) from None
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError, a huge integer or file
        raise InputError(f"{path}: cannot read as JSON ({exc}); fix: pass the model's config.json") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level is {type(data).__name__}, not an object; fix: pass a config.json")
    return model_shape_from_dict(data, source_name=str(path), name=name)


def model_shape_from_dict(
    data: Mapping[str, Any], *, source_name: str = "config", name: str | None = None
) -> ModelShape:
    cfg = Fields(data, source=source_name)
    model_type = cfg.raw("model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = data.get("architectures") or ["?"]
        raise InputError(
            f"{source_name}: unknown architecture model_type={model_type!r} ({arch[0]}); "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}; "
            "fix: pass the config.json of a supported model family"
        )
    name = str(data.get("_name_or_path") or name or (data.get("architectures") or [model_type])[0])
    if model_type in ("llava", "llava_next"):
        text = cfg.sub("text_config")
        text_type = text.string("model_type", "llama")
        if text_type not in _TEXT_DEFAULTS:
            raise text.error(
                "model_type", text_type, "is not a supported LLaVA language model", fix="use llama or mistral"
            )
        text.defaults = _TEXT_DEFAULTS[text_type]
        shape = _decoder(text, text_type, name)
        vision = parse_vision(cfg, model_type, shape.hidden_size)
        notes = tuple(f"default {d}" for d in [*text.defaulted, *cfg.defaulted])
        dtype = cfg.string("torch_dtype", shape.torch_dtype)  # the checkpoint's dtype, not the LM's original
        return replace(shape, model_type=model_type, vision=vision, assumptions=notes, torch_dtype=dtype)
    if model_type == "qwen2_vl":
        flat = dict(data)
        if isinstance(data.get("text_config"), Mapping):  # transformers >= 4.52 nests the LM
            flat.update(data["text_config"])
        shape = _decoder(Fields(flat, source=source_name), "qwen2", name)
        vision = parse_vision(cfg, model_type, shape.hidden_size)
        return replace(shape, model_type=model_type, vision=vision)
    return _decoder(cfg, str(model_type), name)


def _decoder(cfg: Fields, model_type: str, name: str) -> ModelShape:
    layers = cfg.integer("num_hidden_layers")
    hidden = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise cfg.error(
            "num_key_value_heads",
            kv_heads,
            f"must divide num_attention_heads={heads}",
            fix="check the config values",
        )
    head_dim = cfg.integer("head_dim", None) if cfg.has("head_dim") else None
    if head_dim is None:
        if hidden % heads:
            raise cfg.error("hidden_size", hidden, f"is not a multiple of num_attention_heads={heads}")
        head_dim = hidden // heads
    moe, mla = _moe(cfg, model_type), _mla(cfg, model_type)
    dtype = cfg.string("torch_dtype", "bfloat16")
    return ModelShape(
        name=name,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.integer("intermediate_size"),
        vocab_size=cfg.integer("vocab_size"),
        max_position_embeddings=cfg.integer("max_position_embeddings"),
        tie_word_embeddings=cfg.flag("tie_word_embeddings", model_type in ("gemma", "gemma2")),
        qkv_bias=model_type == "qwen2" or cfg.flag("attention_bias", False),
        o_bias=cfg.flag("attention_bias", False),
        norms_per_layer=4 if model_type == "gemma2" else 2,
        layer_windows=_windows(cfg, model_type, layers),
        moe=moe,
        mla=mla,
        torch_dtype=dtype,
        assumptions=tuple(f"default {d}" for d in cfg.defaulted),
    )


def _windows(cfg: Fields, model_type: str, layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window (``None`` = full attention), as the HF modelling code applies it."""
    window = cfg.opt_int("sliding_window")
    if window is None or model_type in ("llama", "gemma", "deepseek_v2", "deepseek_v3"):
        return (None,) * layers  # LLaMA, Gemma-1 and DeepSeek have no sliding-window attention
    if model_type == "gemma2":  # even layers local (sliding), odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(layers))
    if model_type == "qwen2":
        if not cfg.flag("use_sliding_window", False):
            return (None,) * layers
        first = cfg.integer("max_window_layers", layers, minimum=0)
        return tuple(window if i >= first else None for i in range(layers))
    return (window,) * layers  # mistral


def _moe(cfg: Fields, model_type: str) -> MoEShape | None:
    if model_type == "mixtral":
        return MoEShape(
            num_experts=cfg.integer("num_local_experts"),
            experts_per_token=cfg.integer("num_experts_per_tok"),
            expert_intermediate_size=cfg.integer("intermediate_size"),
        )
    if model_type in ("deepseek_v2", "deepseek_v3") and cfg.has("n_routed_experts"):
        width = cfg.integer("moe_intermediate_size")
        return MoEShape(
            num_experts=cfg.integer("n_routed_experts"),
            experts_per_token=cfg.integer("num_experts_per_tok"),
            expert_intermediate_size=width,
            shared_intermediate_size=cfg.integer("n_shared_experts", 0, minimum=0) * width,
            first_dense_layers=cfg.integer("first_k_dense_replace", 0, minimum=0),
            layer_freq=cfg.integer("moe_layer_freq", 1),
        )
    return None


def _mla(cfg: Fields, model_type: str) -> MLAShape | None:
    if model_type not in ("deepseek_v2", "deepseek_v3"):
        return None
    return MLAShape(
        kv_lora_rank=cfg.integer("kv_lora_rank"),
        q_lora_rank=cfg.opt_int("q_lora_rank"),
        qk_nope_head_dim=cfg.integer("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.integer("qk_rope_head_dim"),
        v_head_dim=cfg.integer("v_head_dim"),
    )
