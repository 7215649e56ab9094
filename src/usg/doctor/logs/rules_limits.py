"""Log rules for a request longer than a server's configured limit (TGI's input validation,
TensorRT-LLM's max_num_tokens, OpenAI-compatible context-length errors).

The request is too long for the limit the server was started with: the prompt/shape is the problem
as seen from the request (``shape_or_rank``); the fix names both sides — shorten the request, or
start the server with a larger limit when the model allows it.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (before the drift rule).
"""

from __future__ import annotations

import re
from typing import Any

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []

# TGI's launcher defaults over its releases (max_input_length 1000/1024, max_total_tokens 1512/2048): a request
# stopped at one of them met a server nobody configured for its model — the configuration is the cause
_TGI_DEFAULT_LIMITS = frozenset({1000, 1024, 1512, 2048})


@_rule(
    "LOG045",
    "llm server",
    "request longer than the server limit",
    R.SHAPE_OR_RANK,
    r"`inputs` must have less than (?P<max>\d+) tokens\. Given: (?P<got>\d+)"
    r"|`inputs` tokens \+ `max_new_tokens` must be <= (?P<total>\d+)"
    r"|sum of prompt length \((?P<prompt>[\d.]+)\), query length \([\d.]+\) should not exceed max_num_tokens "
    r"\((?P<mnt>\d+)\)"
    r"|maximum context length of (?P<ctx>\d+) tokens\. You requested a total of (?P<req>\d+) tokens",
    also=(R.CONFIG_INVALID,),
)
def _too_long(m: re.Match[str]) -> Explained:
    ev: dict[str, Any]
    if m["max"]:
        ev = {"input_tokens": int(m["got"]), "max_input_tokens": int(m["max"])}
        what, knob = f"the prompt has {m['got']} tokens; the server accepts fewer than {m['max']}", "--max-input-tokens"
    elif m["total"]:
        ev = {"max_total_tokens": int(m["total"])}
        what, knob = f"prompt plus max_new_tokens exceed the server's {m['total']} total tokens", "--max-total-tokens"
    elif m["mnt"]:
        ev = {"prompt_tokens": int(float(m["prompt"])), "max_num_tokens": int(m["mnt"])}
        what, knob = (
            f"the prompt has {ev['prompt_tokens']} tokens, more than the engine's max_num_tokens {m['mnt']}",
            "max_num_tokens (engine build / LLM API)",
        )
    else:
        ev = {"requested_tokens": int(m["req"]), "context_length": int(m["ctx"])}
        what, knob = (
            f"the request asks for {m['req']} tokens; the model's context is {m['ctx']}",
            "max_tokens (completion budget)",
        )
    limit = int(m["max"] or m["total"] or 0)
    if limit in _TGI_DEFAULT_LIMITS:
        return Explained(
            f"{what}: {limit} is a TGI default, so the server was started without limits for this model",
            f"start the launcher with {knob} (and --max-total-tokens) sized to the model's context, or lower the "
            "client's context window / max_new_tokens to the server's limits",
            {**ev, "default_limit": True},
            R.CONFIG_INVALID,
        )
    return Explained(
        what,
        f"shorten the prompt or the completion budget, or start the server with a larger {knob} if the model's "
        "context length allows it",
        ev,
    )


@_rule(
    "LOG057",
    "tgi",
    "launcher token limits inconsistent",
    R.CONFIG_INVALID,
    r"`max_input_(?:tokens|length)`\s*\((?P<inp>\d+)\) must be < `max_total_tokens`\s*\((?P<tot>\d+)\)",
)
def _tgi_args(m: re.Match[str]) -> Explained:
    inp, tot = int(m["inp"]), int(m["tot"])
    return Explained(
        f"the launcher was started with max_input_tokens {inp} >= max_total_tokens {tot}: the total (prompt + new "
        "tokens) must leave room for at least one generated token",
        f"set --max-input-tokens below --max-total-tokens (e.g. {tot - 1} or less, leaving room for the answers), "
        "or raise --max-total-tokens within the model's context length",
        {"max_input_tokens": inp, "max_total_tokens": tot},
    )


@_rule(
    "LOG058",
    "tensorrt-llm",
    "prompt over the engine's build-time limit",
    R.DYNAMIC_SHAPE_FIXED,
    r"Prompt length \((?P<got>\d+)\) exceeds maximum (?P<what>input|sequence) length \((?P<max>\d+)\)",
)
def _trtllm_len(m: re.Match[str]) -> Explained:
    got, mx = int(m["got"]), int(m["max"])
    flag = "--max_input_len" if m["what"] == "input" else "--max_seq_len"
    return Explained(
        f"the prompt has {got} tokens but the TensorRT-LLM engine was built for at most {mx} ({m['what']} length): "
        "the engine's shapes are bounded when it is built",
        f"rebuild the engine with {flag} >= {got} (trtllm-build {flag} ...), or truncate prompts to {mx} tokens",
        {"prompt_tokens": got, f"max_{m['what']}_len": mx},
    )
