"""The two OpenAI request kinds a ``backend: openai`` model sends, chosen by its ``endpoint`` option.

* ``endpoint: chat`` (default) — ``POST /v1/chat/completions`` with ``messages`` (text and
  ``image_url`` content parts); the model's input is a list of chat messages
  (``usg.ops.llm:chat``) or a string (one user message).
* ``endpoint: completions`` — ``POST /v1/completions`` with a text ``prompt`` (no chat
  template: the prompt is sent as it is); the model's input is a string (``usg.ops.llm:complete``
  builds one from a template).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usg.errors import GraphError, GraphProblem, InputError

__all__ = ["ENDPOINTS", "answer_text", "check_endpoint", "prompt_value", "request_body"]

#: endpoint option -> path at the engine
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def check_endpoint(value: Any, model: str) -> str:
    """The ``endpoint`` option, or a graph error naming the choices."""
    endpoint = str(value or "chat")
    if endpoint not in ENDPOINTS:
        raise GraphError(
            [
                GraphProblem(
                    f"models.{model}.options.endpoint",
                    f"endpoint is {value!r}",
                    "use endpoint: chat (POST /v1/chat/completions) or endpoint: completions (POST /v1/completions)",
                )
            ]
        )
    return endpoint


def _chat_messages(value: Any, model: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and "role" in m for m in value):
        return [dict(m) for m in value]
    raise InputError(
        f"model {model!r} input 'messages': got {type(value).__name__}, not a non-empty list of chat messages",
        field="messages",
        fix="wire the messages of a usg.ops.llm:chat node (or a string) to it",
    )


def prompt_value(endpoint: str, value: Any, model: str) -> list[dict[str, Any]] | str:
    """The chat messages (``chat``) or the prompt string (``completions``) of one item; the
    executor wraps a single value in a one-item list."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if endpoint == "chat":
        return _chat_messages(value, model)
    if isinstance(value, str) and value:
        return value
    got = "chat messages" if isinstance(value, list) and value and isinstance(value[0], Mapping) else repr(value)[:80]
    raise InputError(
        f"model {model!r} (endpoint: completions) input 'messages': got {got}, not a prompt string",
        field="messages",
        fix="wire the prompt of a usg.ops.llm:complete node (or a text input) to it, or set endpoint: chat "
        "for chat messages",
    )


def request_body(
    endpoint: str, model: str | None, prompt: list[dict[str, Any]] | str, max_tokens: int, temperature: Any
) -> dict[str, Any]:
    """The JSON body of the engine request for ``prompt``."""
    key = "messages" if endpoint == "chat" else "prompt"
    body: dict[str, Any] = {"model": model, key: prompt, "max_tokens": max_tokens}
    if temperature is not None:
        body["temperature"] = float(temperature)
    return body


def answer_text(endpoint: str, payload: Any) -> str:
    """The generated text of a (non-streaming) response; ``KeyError``/``IndexError``/``TypeError``
    when it has none."""
    choice = payload["choices"][0]
    text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
    return str(text or "")
