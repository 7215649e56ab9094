"""``backend: openai``: a language model served by an OpenAI-compatible engine (vLLM, SGLang, TGI,
llama.cpp's server, ``transformers serve``).

USG does not generate: it sends one chat completion per item to the engine, which batches
continuously. So the model never gets a batcher here; at most ``max_inflight`` requests are
at the engine at once (a semaphore), and no worker thread is held while it generates
(:meth:`OpenAIBackend.ainfer` awaits the HTTP call on the event loop).

Options: ``url`` (the engine's base URL, with or without ``/v1``), ``model`` (else the only one
``GET /v1/models`` lists), ``api_key_env`` (the variable holding the bearer token),
``max_inflight`` (default 8), ``timeout_s`` (per engine request, default 120), ``retries``
(on 429/503, honouring ``Retry-After``; default 3), ``max_model_len`` (else read from
``/v1/models`` where the engine reports it, as vLLM does), ``max_tokens`` (default 256),
``temperature``, ``tokenizer`` (a ``tokenizer.json`` to count prompt tokens exactly; else an
over-estimate), ``image_tokens`` (prompt tokens one image counts for, default 0).

Input ``messages``: a list of chat messages (``usg.ops.llm:chat`` builds them), or a string
(one user message). Output ``text``: the answer.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from usg.backends.base import Backend, BackendState
from usg.errors import BackendError, GraphError, GraphProblem, InputError, PayloadTooLarge, RequestTimeout, StateError
from usg.records import ItemTiming
from usg.specs import TensorSpec

__all__ = ["LLM_INPUTS", "LLM_OUTPUTS", "OpenAIBackend", "count_prompt_tokens"]

#: messages are JSON (a list of dicts), not tensors: the backend checks their structure itself
LLM_INPUTS = {"messages": TensorSpec()}
LLM_OUTPUTS = {"text": TensorSpec("str")}
_RETRY_STATUS = (429, 503)
_MAX_RETRY_AFTER_S = 30.0
_PER_MESSAGE_TOKENS = 8  # chat-template markers around each message (role, start/end tokens)


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        from usg.errors import MissingDependency

        raise MissingDependency("httpx", "llm", "backend: openai") from None
    return httpx


def _text_parts(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], int]:
    """The text of every message (content strings and text parts), and the number of images."""
    texts: list[str] = []
    images = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or ():
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                images += 1
    return texts, images


def count_prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tokenizer: Any | None = None, *, image_tokens: int = 0
) -> tuple[int, str]:
    """Prompt tokens of ``messages`` and how they were counted: exactly with a ``tokenizers``
    tokenizer, else an over-estimate (one token per 3 UTF-8 bytes, rounded up)."""
    texts, images = _text_parts(messages)
    overhead = _PER_MESSAGE_TOKENS * len(messages) + image_tokens * images
    if tokenizer is not None:
        counted = sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)) if texts else 0
        return counted + overhead, "counted with the model's tokenizer"
    estimate = sum(math.ceil(len(t.encode("utf-8")) / 3) for t in texts)
    return estimate + overhead, "estimated (UTF-8 bytes / 3; set options.tokenizer for an exact count)"


def _messages(value: Any, model: str) -> list[dict[str, Any]]:
    """The chat messages of one item (the executor wraps a string in a one-item list)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and "role" in m for m in value):
        return [dict(m) for m in value]
    raise InputError(
        f"model {model!r} input 'messages': got {type(value).__name__}, not a non-empty list of chat messages",
        field="messages",
        fix="wire the messages of a usg.ops.llm:chat node (or a string) to it",
    )


def _retry_after(headers: Mapping[str, str], attempt: int) -> float:
    raw = headers.get("retry-after")
    try:
        wait = float(raw) if raw is not None else 0.5 * 2**attempt
    except ValueError:  # an HTTP date: back off as if it said nothing
        wait = 0.5 * 2**attempt
    return min(max(wait, 0.0), _MAX_RETRY_AFTER_S)


def _engine_message(resp: Any) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))[:500]
    return str(err)[:500]


def _expand(value: Any, where: str) -> str:
    """``${VAR}`` in a url or model option, from the environment; an unset one is a graph error."""
    text = os.path.expandvars(str(value))
    if "$" in text:
        missing = sorted(set(re.findall(r"\$\{?(\w+)", text)))
        raise GraphError(
            [GraphProblem(where, f"{value!r} names {', '.join(missing)}, which is not set", f"export {missing[0]}=...")]
        )
    return text


class OpenAIBackend(Backend):
    """Chat completions at an OpenAI-compatible engine; see the module docstring for options."""

    kind = "openai"
    remote = True  # awaited on the event loop, never batched here: the engine batches

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__()
        opts = dict(options or {})
        self.name = name or "llm"
        url = _expand(opts.get("url") or "", f"models.{self.name}.options.url").rstrip("/")
        if not url:
            raise GraphError(
                [
                    GraphProblem(
                        f"models.{self.name}.options.url",
                        "backend openai without a url",
                        "add options: {url: http://127.0.0.1:8000} (the engine's OpenAI-compatible address)",
                    )
                ]
            )
        self.url = url[: -len("/v1")] if url.endswith("/v1") else url
        model = _expand(opts["model"], f"models.{self.name}.options.model") if opts.get("model") else None
        self.model: str | None = model or None
        self.api_key_env = opts.get("api_key_env")
        self.max_inflight = max(1, int(opts.get("max_inflight", 8)))
        self.timeout_s = float(opts.get("timeout_s", 120.0))
        self.retries = max(0, int(opts.get("retries", 3)))
        self.max_tokens = int(opts.get("max_tokens", 256))
        self.temperature = opts.get("temperature")
        self.image_tokens = int(opts.get("image_tokens", 0))
        declared = opts.get("max_model_len")
        self.max_model_len: int | None = int(declared) if declared else None
        self.tokenizer_path = Path(opts["tokenizer"]) if opts.get("tokenizer") else None
        self._tokenizer: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._discovered = False
        self._discovery: asyncio.Lock | None = None

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]:
        return {}  # messages are not tensors; :func:`_messages` checks them

    @property
    def output_specs(self) -> Mapping[str, TensorSpec]:
        return LLM_OUTPUTS

    @property
    def description(self) -> str:
        return f"openai-compatible engine at {self.url} (model {self.model or '?'})"

    def _headers(self) -> dict[str, str]:
        if not self.api_key_env:
            return {}
        key = os.environ.get(str(self.api_key_env))
        if not key:
            raise StateError(
                f"model {self.name!r}: api_key_env names {self.api_key_env!r}, which is not set; "
                f"fix: export {self.api_key_env}=... before starting usg"
            )
        return {"Authorization": f"Bearer {key}"}

    def load(self) -> None:
        """Load the tokenizer (if given) and ask the engine for its models (if it is up: an engine
        started later is asked at the first request)."""
        if self.tokenizer_path is not None and self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        httpx = _httpx()
        try:
            with httpx.Client(timeout=min(self.timeout_s, 10.0), headers=self._headers()) as client:
                self._use_models(client.get(f"{self.url}/v1/models"))
        except httpx.TransportError:
            pass
        self.state = BackendState.LOADED

    def _use_models(self, resp: Any) -> None:
        if resp.status_code >= 400:
            if self.model is not None:  # an engine without /v1/models: the declared options stand
                self._discovered = True
                return
            raise self._engine_error(resp, "GET /v1/models")
        listed = [m for m in resp.json().get("data", []) if isinstance(m, dict) and m.get("id")]
        if self.model is None:
            if len(listed) != 1:
                ids = [str(m["id"]) for m in listed]
                raise StateError(
                    f"model {self.name!r}: the engine at {self.url} lists {len(ids)} models {ids}; "
                    "fix: name one with options.model"
                )
            self.model = str(listed[0]["id"])
        if self.max_model_len is None:
            for m in listed:
                if m["id"] == self.model and m.get("max_model_len"):
                    self.max_model_len = int(m["max_model_len"])
        self._discovered = True

    def _down(self, exc: Exception) -> StateError:
        return StateError(
            f"model {self.name!r} (engine model {self.model or '?'}): the engine at {self.url} is not reachable "
            f"({type(exc).__name__}: {exc}); fix: start it (e.g. `vllm serve MODEL --port PORT` or "
            "`transformers serve`) or point options.url at it"
        )

    def _engine_error(self, resp: Any, what: str) -> BackendError:
        err = BackendError(
            f"model {self.name!r}: the engine at {self.url} answered {what} with HTTP {resp.status_code}: "
            f"{_engine_message(resp)}"
        )
        err.status = int(resp.status_code)
        return err

    def _async_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            httpx = _httpx()
            limits = httpx.Limits(max_connections=self.max_inflight, max_keepalive_connections=self.max_inflight)
            self._client = httpx.AsyncClient(timeout=self.timeout_s, limits=limits)
            self._client_loop = loop
            self._sem = asyncio.Semaphore(self.max_inflight)
            self._discovery = asyncio.Lock()
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connections to the engine (on the loop that opened them)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        self.close()

    def request_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat completion sent for ``messages`` (after the budget check)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        if self.temperature is not None:
            body["temperature"] = float(self.temperature)
        return body

    def check_budget(self, messages: list[dict[str, Any]]) -> None:
        """Raise :class:`PayloadTooLarge` when prompt + ``max_tokens`` cannot fit ``max_model_len``."""
        if self.max_model_len is None:
            return
        prompt, how = count_prompt_tokens(messages, self._tokenizer, image_tokens=self.image_tokens)
        if prompt + self.max_tokens > self.max_model_len:
            raise PayloadTooLarge(
                f"model {self.name!r}: prompt {prompt} tokens ({how}) + max_tokens {self.max_tokens} = "
                f"{prompt + self.max_tokens}, above the engine's max_model_len {self.max_model_len}",
                field="messages",
                fix="send a shorter question or document, lower options.max_tokens, or serve the model "
                "with a longer context (vLLM --max-model-len)",
            )

    async def ainfer(self, inputs: Mapping[str, Any], timing: ItemTiming | None = None) -> dict[str, Any]:
        client = self._async_client()
        messages = _messages(inputs.get("messages"), self.name)
        httpx = _httpx()
        if not self._discovered and (self.model is None or self.max_model_len is None):
            assert self._discovery is not None
            async with self._discovery:  # the first requests ask once, not once each
                if not self._discovered:
                    try:
                        self._use_models(await client.get(f"{self.url}/v1/models", headers=self._headers()))
                    except httpx.TransportError as exc:
                        raise self._down(exc) from None
        self.check_budget(messages)
        body = self.request_body(messages)
        assert self._sem is not None
        async with self._sem:
            resp = await self._post(client, body)
        return {"text": self._answer(resp)}

    async def _post(self, client: Any, body: dict[str, Any]) -> Any:
        httpx = _httpx()
        url = f"{self.url}/v1/chat/completions"
        for attempt in range(self.retries + 1):
            try:
                resp = await client.post(url, json=body, headers=self._headers())
            except httpx.TimeoutException:
                raise RequestTimeout(
                    f"model {self.name!r}: the engine at {self.url} did not answer within {self.timeout_s:g} s; "
                    "fix: raise options.timeout_s, lower max_tokens, or check the engine's load"
                ) from None
            except httpx.TransportError as exc:
                raise self._down(exc) from None
            if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                await asyncio.sleep(_retry_after(resp.headers, attempt))
                continue
            if resp.status_code >= 400:
                raise self._engine_error(resp, "POST /v1/chat/completions")
            return resp
        raise AssertionError("unreachable")

    def _answer(self, resp: Any) -> str:
        try:
            return str(resp.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError):
            raise BackendError(
                f"model {self.name!r}: the engine at {self.url} sent a chat completion without "
                f"choices[0].message.content: {resp.text[:300]!r}; fix: check that it speaks the OpenAI API"
            ) from None

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """One item from a worker thread (the executor awaits :meth:`ainfer` instead)."""

        async def once() -> dict[str, Any]:
            try:
                return await self.ainfer(inputs)
            finally:
                await self.aclose()
                self.state = BackendState.LOADED

        return asyncio.run(once())
