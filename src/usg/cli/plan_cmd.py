"""``usg plan``: size weights, KV cache and engine limits for an LLM / VLM on given GPUs."""

from __future__ import annotations

import re

import click

from usg.errors import UsageError

__all__ = ["plan"]


def _image_size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(-?\d+)\s*[x×,]\s*(-?\d+)\s*", text)
    if not match:
        raise UsageError(f"--image-size {text!r} is not WIDTHxHEIGHT; fix: write e.g. --image-size 448x448")
    width, height = int(match.group(1)), int(match.group(2))
    if width <= 0 or height <= 0:
        raise UsageError(f"--image-size {text!r} must be positive; fix: write e.g. --image-size 448x448")
    return width, height


@click.command("plan")
@click.argument("config", metavar="CONFIG")
@click.option("--gpu", "gpu_spec", metavar="NAME[xN]", help="GPU profile and count, e.g. L4, H100x8, gpus.yaml.")
@click.option("--gpu-file", metavar="FILE", help="YAML/JSON with custom GPU profiles (name, memory_gb, ...).")
@click.option("--max-model-len", type=int, help="Longest prompt + output in tokens [model maximum].")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Sequences running at once.")
@click.option("--images-per-prompt", type=int, help="Images per prompt (VLMs) [1 for VLMs, else 0].")
@click.option("--image-size", metavar="WxH", help="Image size to plan for [the processor's worst case].")
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True)
@click.option("--dtype", default="auto", show_default=True, help="Weights: auto, fp32, bf16, fp16, fp8, int8, int4.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache: auto, bf16, fp16, fp8.")
@click.option("--max-num-batched-tokens", type=int, help="Tokens per engine step [vLLM default].")
@click.option("--block-size", type=int, default=16, show_default=True, help="KV block size in tokens.")
@click.option("--tensor-parallel-size", type=int, help="TP degree [all GPUs of --gpu].")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--plot", "plot_file", metavar="FILE", help="Write a memory-vs-concurrency plot (PNG/SVG/PDF).")
def plan(
    config: str,
    gpu_spec: str | None,
    gpu_file: str | None,
    max_model_len: int | None,
    concurrency: int,
    images_per_prompt: int | None,
    image_size: str | None,
    gpu_memory_utilization: float,
    dtype: str,
    kv_cache_dtype: str,
    max_num_batched_tokens: int | None,
    block_size: int,
    tensor_parallel_size: int | None,
    as_json: bool,
    plot_file: str | None,
) -> None:
    """Plan memory and KV cache for serving the model of CONFIG (a config.json or its directory).

    Says whether the target fits, the per-GPU breakdown, the max concurrency,
    vLLM KV blocks, the smallest tensor-parallel degree, throughput bounds, and
    ready-to-use vLLM / TensorRT-LLM settings — or which knob to turn.
    """
    from usg.plan import Target, load_gpu_profiles, load_model_config, parse_gpu_spec
    from usg.plan import plan as make_plan
    from usg.plan.render import plot_plan, print_plan

    model = load_model_config(config)
    custom = load_gpu_profiles(gpu_file) if gpu_file else {}
    if gpu_spec is None:
        if len(custom) != 1:
            raise UsageError(
                "no GPU given; fix: pass --gpu NAME[xN], e.g. --gpu L4 or --gpu H100-80GBx8 "
                "(or --gpu-file with exactly one profile)"
            )
        gpu_spec = next(iter(custom))
    gpu, count = parse_gpu_spec(gpu_spec, custom)
    if images_per_prompt is None:
        images_per_prompt = 1 if model.vision is not None else 0
    if block_size < 1:
        raise UsageError(f"--block-size {block_size} must be >= 1; fix: use 16 (the vLLM default)")
    target = Target(
        max_model_len=model.max_position_embeddings if max_model_len is None else max_model_len,
        concurrency=concurrency,
        images_per_prompt=images_per_prompt,
        image_size=_image_size(image_size),
        gpu_memory_utilization=gpu_memory_utilization,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
    )
    result = make_plan(model, gpu, target, gpu_count=count, tensor_parallel_size=tensor_parallel_size)
    if plot_file:
        plot_plan(result, plot_file)
    if as_json:
        click.echo(result.to_json())
    else:
        print_plan(result)
        if plot_file:
            click.echo(f"plot written to {plot_file}")
