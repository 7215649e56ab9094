"""Static token budget of LLM nodes (GRAPH030): can the worst-case request fit the engine's context?

For every node of a ``backend: openai`` model fed by a ``usg.ops.llm:chat`` node that sends an
image (an ``image`` port wired, ``vlm`` not false), the image tokens of the largest image the
graph accepts (its input ``shape`` if fixed, else ``limits.max_image_pixels`` and
``limits.max_aspect_ratio``) are computed from the model's HF configs (``options.hf_model``, via
:mod:`usg.vision_tokens`, the arithmetic the backend's run-time budget uses) or
``options.image_tokens``. With the template's own text and ``options.max_tokens`` they must fit
``options.max_model_len`` (else the ``max_position_embeddings`` of ``hf_model``'s config, what
vLLM serves by default); a request that cannot is one the server would refuse with 413 every
time. A graph that fits has no finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, Location, RootCause, Severity
from usg.doctor.graph.checks import _built, line_for
from usg.doctor.registry import CodeInfo, check, finding
from usg.doctor.runner import CheckContext

__all__ = ["C_LLM_BUDGET", "check_llm_budget"]

C_LLM_BUDGET = CodeInfo(
    "GRAPH030",
    Severity.ERROR,
    RootCause.MEMORY,
    "LLM node: worst-case prompt + max_tokens exceed max_model_len",
    "The largest image the graph accepts takes more tokens (from the model's HF configs) than the "
    "engine's context leaves after the prompt template and max_tokens: such requests are refused "
    "with 413 every time.",
)

_DEFAULT_MAX_TOKENS = 256


def _max_model_len(options: dict[str, Any], hf: Path | None) -> tuple[int | None, str]:
    from usg.backends.llm_budget import hf_context_len

    if options.get("max_model_len"):
        return int(options["max_model_len"]), "options.max_model_len"
    limit = hf_context_len(hf) if hf is not None else None
    return limit, "max_position_embeddings of hf_model/config.json" if limit else ""


def _image_size(graph: Any, ref: Any) -> tuple[int, int] | None:
    """(height, width) when the image input feeding ``ref`` declares fixed dims."""
    if ref is None or not ref.is_graph_input:
        return None
    spec = graph.inputs[ref.port].spec
    shape = getattr(spec, "shape", None)
    if shape and len(shape) >= 2 and isinstance(shape[0], int) and isinstance(shape[1], int):
        return int(shape[0]), int(shape[1])
    return None


def _template_tokens(budget: Any, options: dict[str, Any]) -> int:
    """Tokens of the chat template's fixed text (placeholders count nothing)."""
    messages = [
        {"role": r, "content": re.sub(r"\{\w+\}", "", str(options.get(k, d)))}
        for r, k, d in (("system", "system", ""), ("user", "user", "{question}"))
        if r == "user" or options.get(k)
    ]
    return budget.count(messages).text


def _image_cost(graph: Any, prompt: Any, budget: Any) -> tuple[int, str, dict[str, Any]] | None:
    """Tokens of the largest image ``prompt`` (a chat node) can send, with how it was found."""
    limits = graph.limits
    size = _image_size(graph, prompt.inputs.get("image"))
    if budget.fixed_image_tokens is not None:
        n = budget.fixed_image_tokens
        return n, f"options.image_tokens = {n}", {"image_tokens": n}
    vision = budget.vision
    if vision is None:
        return None
    if size is not None:
        n = vision.count(*size)
        return n, f"a {size[0]}x{size[1]} image (the input's declared shape): {vision.rule}", {"image_size": size}
    n, at = vision.worst(limits.max_image_pixels, limits.max_aspect_ratio)
    where = f" at {at[0]}x{at[1]}" if at else ""
    how = (
        f"the largest image within limits.max_image_pixels {limits.max_image_pixels} and max_aspect_ratio "
        f"{limits.max_aspect_ratio:g}{where}: {vision.rule}"
    )
    return n, how, {"image_size": list(at) if at else None, "max_image_pixels": limits.max_image_pixels}


_FIXED_COUNT_FAMILIES = ("llava", "paligemma")


def _fix(vision: Any, room: int, need: int, limit: int, max_tokens: int) -> str:
    parts = []
    # LLaVA-1.5 and PaliGemma (and options.image_tokens) take the same tokens for any image size
    size_dependent = vision is not None and vision.family not in _FIXED_COUNT_FAMILIES
    if vision is not None and vision.pixels_per_token and room > 2:
        px = (room - 2) * vision.pixels_per_token
        parts.append(f"cap the processor's max_pixels at {px} (vLLM --mm-processor-kwargs '{{\"max_pixels\": {px}}}')")
    elif room > 0 and size_dependent:
        parts.append("declare a smaller image (the input's shape or limits.max_image_pixels)")
    if max_tokens > need - limit:
        parts.append(f"lower options.max_tokens to {max_tokens - (need - limit)}")
    parts.append(f"serve the model with max_model_len >= {need} (vLLM --max-model-len {need})")
    return ", or ".join(parts)


@check("graph", codes=[C_LLM_BUDGET])
def check_llm_budget(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    """GRAPH030 for each LLM node whose worst-case image request cannot fit."""
    from usg.backends.llm_budget import PromptBudget
    from usg.errors import GraphError

    built = _built(path, ctx)
    graph = built.graph
    if graph is None:
        return
    for node in graph.nodes.values():
        model = graph.models.get(node.model) if node.model else None
        ref = node.inputs.get("messages")
        if model is None or model.backend != "openai" or ref is None or ref.is_graph_input:
            continue
        prompt = graph.nodes.get(ref.source)
        if prompt is None or prompt.fn != "usg.ops.llm:chat" or "image" not in prompt.inputs:
            continue
        if prompt.options.get("vlm", True) is False:
            continue
        opts = dict(model.options)
        budget = PromptBudget(opts, model.name)
        try:
            budget.load()
        except GraphError:
            continue  # the graph build / run reports the bad path
        limit, limit_from = _max_model_len(opts, budget.hf_model)
        cost = _image_cost(graph, prompt, budget)
        if limit is None or cost is None:
            continue
        image, how, evidence = cost
        max_tokens = int(opts.get("max_tokens", _DEFAULT_MAX_TOKENS))
        text = _template_tokens(budget, prompt.options)
        need = text + image + max_tokens
        if need <= limit:
            continue
        room = limit - max_tokens - text
        yield finding(
            C_LLM_BUDGET,
            message=(
                f"node {node.name!r} (model {model.name!r}): one image {image} tokens ({how}) + prompt template "
                f"{text} tokens + max_tokens {max_tokens} = {need}, above max_model_len {limit} ({limit_from})"
            ),
            where=Location(str(path), f"nodes.{node.name}", line_for(built.text, f"nodes.{node.name}")),
            fix=_fix(budget.vision, room, need, limit, max_tokens),
            evidence={
                **evidence,
                "image_tokens": image,
                "template_tokens": text,
                "max_tokens": max_tokens,
                "max_model_len": limit,
            },
        )
