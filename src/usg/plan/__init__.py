"""Memory and KV-cache planning for LLM / VLM serving.

Read a Hugging Face ``config.json``, pick a GPU, state the target, get a
:class:`Plan`::

    from usg.plan import Target, get_gpu, load_model_config, plan

    model = load_model_config("Meta-Llama-3-8B/config.json")
    p = plan(model, get_gpu("L4"), Target(max_model_len=8192, concurrency=16))
    p.fits, p.max_concurrency, p.settings.vllm_command()
"""

from usg.plan.advice import Advice
from usg.plan.architectures import ModelShape, load_model_config
from usg.plan.hardware import GPUProfile, get_gpu, load_gpu_profiles, parse_gpu_spec
from usg.plan.kv import KVCache, kv_cache
from usg.plan.memory import MemoryBreakdown, Target
from usg.plan.params import ParamCount, count_params, weight_bytes
from usg.plan.planner import Plan, Settings, plan
from usg.plan.vision import VisionShape

__all__ = [
    "Advice",
    "GPUProfile",
    "KVCache",
    "MemoryBreakdown",
    "ModelShape",
    "ParamCount",
    "Plan",
    "Settings",
    "Target",
    "VisionShape",
    "count_params",
    "get_gpu",
    "kv_cache",
    "load_gpu_profiles",
    "load_model_config",
    "parse_gpu_spec",
    "plan",
    "weight_bytes",
]
