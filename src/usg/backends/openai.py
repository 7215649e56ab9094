"""``backend: openai``: a language model served by an OpenAI-compatible engine (vLLM, SGLang, TGI,
llama.cpp's server, ``transformers serve``).

USG does not generate: it sends one chat completion (or completion) per item to the engine, which batches
continuously. So the model never gets a batcher here; at most ``max_inflight`` requests are
at the engine at once (a semaphore), and no worker thread is held while it generates
(:meth:`OpenAIBackend.ainfer` awaits the HTTP call on the event loop).

Options: ``url`` (the engine's base URL, with or without ``/v1``), ``model`` (else the only one
``GET /v1/models`` lists), ``api_key_env`` (the variable holding the bearer token),
``max_inflight`` (default 8), ``timeout_s`` (per engine request, default 120), ``retries``
(on 429/503, honouring ``Retry-After``; default 3), ``max_model_len`` (else read from
``/v1/models`` where the engine reports it, as vLLM does), ``max_tokens`` (default 256),
``temperature``, ``endpoint`` (``chat`` or ``completions``: :mod:`usg.backends.openai_api`),
``tokenizer`` / ``hf_model`` / ``image_tokens`` (the token budget: :mod:`usg.backends.llm_budget`).
``engine_stream``: ``auto`` (the default) asks the engine to stream when the caller streams (SSE,
``generate_stream``, ``usg run --stream``: token deltas reach it as they are generated, time to
first token and inter-token latency are measured) and for one whole completion when it does not
(one read of the engine's answer instead of one wake-up per streamed chunk, as a client calling
the engine directly would ask; a cancelled request closes its connection, which stops the
generation in engines that watch for it, as vLLM does; ``transformers serve`` finishes it);
``true`` always streams (time to first token for every request, and a cancelled request stops
any engine that notices a closed stream); ``false`` never does (an engine without SSE).

Input ``messages``: a list of chat messages (``usg.ops.llm:chat`` builds them), or a string
(one user message; with ``endpoint: completions`` the prompt, e.g. from ``usg.ops.llm:complete``).
Output ``text``: the answer.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from usg.backends import openai_api
from usg.backends.base import Backend, BackendState
from usg.backends.engine_http import (
    MAX_BODY_BYTES,
    EngineClient,
    EngineProtocolError,
    EngineResponse,
    EngineTimeout,
    EngineTransportError,
    lean_client_applies,
)
from usg.backends.llm_budget import PromptBudget, count_prompt_tokens
from usg.backends.openai_stream import (
    DEFAULT_MAX_TOKENS,
    CallRecorder,
    ChatStreamReader,
    read_chat_stream,
    stream_cut,
)
from usg.errors import (
    BackendError,
    GraphError,
    GraphProblem,
    Overloaded,
    RequestTimeout,
    StateError,
    USGError,
)
from usg.records import ItemTiming
from usg.specs import TensorSpec

__all__ = ["LLM_INPUTS", "LLM_OUTPUTS", "OpenAIBackend", "count_prompt_tokens"]

#: messages are JSON (a list of dicts), not tensors: the backend checks their structure itself
LLM_INPUTS = {"messages": TensorSpec()}
LLM_OUTPUTS = {"text": TensorSpec("str")}
_RETRY_STATUS = (429, 503)
_MAX_RETRY_AFTER_S = 30.0


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        from usg.errors import MissingDependency

        raise MissingDependency("httpx", "llm", "backend: openai") from None
    return httpx


def _timeouts() -> tuple[type[Exception], ...]:
    return (_httpx().TimeoutException, EngineTimeout)


def _transport_errors() -> tuple[type[Exception], ...]:
    return (_httpx().TransportError, EngineTransportError)


def _retry_after(headers: Mapping[str, str], attempt: int) -> float:
    """Seconds to wait before retrying a 429/503: its ``Retry-After`` (seconds or an HTTP date),
    else 0.5 s doubling per attempt; at most :data:`_MAX_RETRY_AFTER_S`."""
    raw = headers.get("retry-after")
    wait = 0.5 * 2**attempt
    if raw is not None:
        try:
            wait = float(raw)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(raw)
                wait = when.timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                pass  # unreadable: back off as if it said nothing
    if math.isnan(wait):
        wait = 0.5 * 2**attempt
    return min(max(wait, 0.0), _MAX_RETRY_AFTER_S)


def _engine_message(resp: Any) -> str:
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # RecursionError: nested past the parser
        return resp.text[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))[:500]
    return str(err)[:500]


#: what USG asks engines for over httpx: uncompressed bodies, so their size bound holds before anything inflates
_IDENTITY = {"Accept-Encoding": "identity"}


def _stream_mode(value: Any, name: str) -> bool | str:
    """``options.engine_stream``: ``auto``, true or false."""
    if isinstance(value, bool) or value == "auto":
        return value
    raise GraphError(
        [
            GraphProblem(
                f"models.{name}.options.engine_stream",
                f"{value!r} is not a stream mode",
                "use auto (stream from the engine when the caller streams), true (always) or false (never)",
            )
        ]
    )


def _expand(value: Any, where: str) -> str:
    """``${VAR}`` in a url or model option, from the environment; an unset one is a graph error."""
    text = os.path.expandvars(str(value))
    if "$" in text:
        missing = sorted(set(re.findall(r"\$\{?(\w+)", text)))
        raise GraphError(
            [GraphProblem(where, f"{value!r} names {', '.join(missing)}, which is not set", f"export {missing[0]}=...")]
        )
    return text


def _option_number(opts: Mapping[str, Any], key: str, default: Any, model: str, *, integer: bool, low: float) -> Any:
    """A numeric option (``max_inflight``, ``timeout_s``, ``retries``, ``max_tokens``), or a graph
    problem naming it: ``max_tokens: lots`` or ``timeout_s: soon`` were internal errors (ValueError)
    at start, ``max_inflight: 0`` was taken as 1 and ``retries: -1`` as 0 without a word."""
    value = opts.get(key, default)
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if ok and (not math.isfinite(value) or value < low or (not integer and value == low)):
        ok = False
    if not ok:
        what = "a whole number" if integer else "a number of seconds"
        bound = f">= {low:g}" if integer else f"> {low:g}"
        raise GraphError(
            [
                GraphProblem(
                    f"models.{model}.options.{key}",
                    f"{key} is {value!r}",
                    f"use {what} {bound} (default {default}), or leave it out",
                )
            ]
        )
    return int(value) if integer else float(value)


def _model_list(resp: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The entries of a ``GET /v1/models`` answer, or what is wrong with it (``"not JSON"``, ...)."""
    try:
        doc = resp.json()
    except (ValueError, RecursionError):  # UnicodeDecodeError included; RecursionError: nested past the parser
        return [], "not JSON"
    if not isinstance(doc, dict):
        return [], f"a {type(doc).__name__}, not an object with a data list"
    data = doc.get("data")
    if not isinstance(data, list):
        return [], "no data list" if data is None else f"data is a {type(data).__name__}, not a list"
    for i, m in enumerate(data):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not m["id"]:
            return [], f"data[{i}] has an id that is not a string ({str(m)[:40]})"
    return data, None


class _Whole:
    """A response read whole through httpx by :meth:`OpenAIBackend._read_whole` (what the backend
    reads of one: status, headers, the body as bytes, text and JSON)."""

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status_code, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Retry(Exception):
    """The engine said 429/503 and a retry is left: wait ``wait_s`` and send again."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s


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
        if not re.match(r"https?://[^/]", url, re.IGNORECASE):
            # without a scheme the first request failed as "the engine is not reachable ... start it"
            raise GraphError(
                [
                    GraphProblem(
                        f"models.{self.name}.options.url",
                        f"url {url!r} is not an http:// or https:// address",
                        f"write the scheme too, e.g. url: http://{url.split('://')[-1] or '127.0.0.1:8000'}",
                    )
                ]
            )
        self.url = url[: -len("/v1")] if url.endswith("/v1") else url
        model = _expand(opts["model"], f"models.{self.name}.options.model") if opts.get("model") else None
        self.model: str | None = model or None
        self.api_key_env = opts.get("api_key_env")
        self.max_inflight = _option_number(opts, "max_inflight", 8, self.name, integer=True, low=1)
        self.timeout_s = _option_number(opts, "timeout_s", 120.0, self.name, integer=False, low=0)
        self.retries = _option_number(opts, "retries", 3, self.name, integer=True, low=0)
        self.max_tokens = _option_number(opts, "max_tokens", DEFAULT_MAX_TOKENS, self.name, integer=True, low=1)
        self.temperature = opts.get("temperature")
        self.endpoint = openai_api.check_endpoint(opts.get("endpoint"), self.name)
        self.budget = PromptBudget(opts, self.name)
        self.engine_stream = _stream_mode(opts.get("engine_stream", "auto"), self.name)
        #: requests at the engine now (at most max_inflight)
        self.inflight = 0
        declared = opts.get("max_model_len")
        self.max_model_len: int | None = int(declared) if declared else None
        self._sem: asyncio.Semaphore | None = None
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._discovered = False
        self._discovery: asyncio.Lock | None = None

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]:
        return {}  # messages are not tensors; :func:`usg.backends.openai_api.prompt_value` checks them

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
        self.budget.load()
        httpx = _httpx()
        try:
            with httpx.Client(timeout=min(self.timeout_s, 10.0), headers={**_IDENTITY, **self._headers()}) as client:
                with client.stream("GET", f"{self.url}/v1/models") as resp:
                    body = bytearray()
                    for piece in resp.iter_bytes():  # as much as the engine client takes (engine_http)
                        body += piece
                        if len(body) > MAX_BODY_BYTES:
                            raise self._bad_gateway(
                                EngineProtocolError(
                                    f"the engine at {self.url} sent a body over {MAX_BODY_BYTES} bytes for "
                                    "GET /v1/models; fix: check what listens at options.url"
                                )
                            )
                self._use_models(httpx.Response(resp.status_code, content=bytes(body)))
        except httpx.TransportError:
            pass
        self.state = BackendState.LOADED

    def _use_models(self, resp: Any) -> None:
        if resp.status_code >= 400:
            if self.model is not None:  # an engine without /v1/models: the declared options stand
                self._discovered = True
                return
            raise self._engine_error(resp, "GET /v1/models")
        listed, problem = _model_list(resp)
        if problem is not None:
            if self.model is not None:  # the list is not needed: the declared options stand
                self._discovered = True
                return
            err = BackendError(
                f"model {self.name!r}: the engine at {self.url} answered GET /v1/models with {problem}, "
                f"not an OpenAI model list ({resp.text[:40]!r}); fix: check that options.url is the engine's "
                "address, or set options.model (then the list is not needed)"
            )
            err.status = 502
            raise err
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
                length = m.get("max_model_len")
                # only a positive integer: it bounds every prompt (true would be read as 1 and refuse them all)
                if m["id"] == self.model and type(length) is int and length > 0:
                    self.max_model_len = length
        self._discovered = True

    def _down(self, exc: Exception) -> StateError:
        return StateError(
            f"model {self.name!r} (engine model {self.model or '?'}): the engine at {self.url} is not reachable "
            f"({type(exc).__name__}: {exc}); fix: start it (e.g. `vllm serve MODEL --port PORT` or "
            "`transformers serve`) or point options.url at it"
        )

    def _bad_gateway(self, exc: EngineProtocolError) -> BackendError:
        """The engine answered outside HTTP/1.1 or the size limits: a 502 (bad gateway)."""
        err = BackendError(f"model {self.name!r}: {exc}")
        err.status = 502
        return err

    def _engine_error(self, resp: Any, what: str) -> USGError:
        """The engine's error answer, with its status: :class:`Overloaded` (with the engine's
        ``Retry-After``, for the client) when it is busy (429/503) and the retries ran out."""
        message = (
            f"model {self.name!r}: the engine at {self.url} answered {what} with HTTP {resp.status_code}: "
            f"{_engine_message(resp)}"
        )
        err: USGError
        if resp.status_code in _RETRY_STATUS:
            wait = _retry_after(resp.headers, 1)  # its Retry-After (at most 30 s), else 1 s
            err = Overloaded(
                f"{message}; fix: retry after {wait:g} s (the engine is at capacity: give it more, or raise "
                f"options.retries, {self.retries} now, to wait for it longer)",
                retry_after=wait,
                why="engine",
            )
        else:
            err = BackendError(message)
        err.status = int(resp.status_code)
        return err

    def _async_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            if lean_client_applies(self.url):  # plain http, no proxy: USG's own client (engine_http)
                self._client = EngineClient(self.url, self.timeout_s, self.max_inflight)
            else:  # https, or through a proxy: httpx
                httpx = _httpx()
                limits = httpx.Limits(max_connections=self.max_inflight, max_keepalive_connections=self.max_inflight)
                # identity: a compressed answer would be bounded only after it inflated (one 1 MiB gzip chunk
                # of zeros is ~1 GiB); engines answer tokens and JSON, which gain little from compression
                self._client = httpx.AsyncClient(timeout=self.timeout_s, limits=limits, headers=_IDENTITY)
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

    def request_body(self, prompt: list[dict[str, Any]] | str) -> dict[str, Any]:
        """The engine request sent for ``prompt`` (after the budget check)."""
        return openai_api.request_body(self.endpoint, self.model, prompt, self.max_tokens, self.temperature)

    def check_budget(self, prompt: list[dict[str, Any]] | str) -> None:
        """Raise :class:`PayloadTooLarge` when prompt + images + ``max_tokens`` cannot fit ``max_model_len``."""
        self.budget.check(prompt, self.max_tokens, self.max_model_len)

    async def ainfer(self, inputs: Mapping[str, Any], timing: ItemTiming | None = None) -> dict[str, Any]:
        return await self.astream(inputs, None, timing)

    async def astream(
        self,
        inputs: Mapping[str, Any],
        on_token: Callable[[str], None] | None,
        timing: ItemTiming | None = None,
    ) -> dict[str, Any]:
        """One chat completion; ``on_token`` gets each content delta as the engine streams it, and
        ``timing.engine_calls`` each request sent (see :class:`usg.records.EngineCall`)."""
        client = self._async_client()
        messages = openai_api.prompt_value(self.endpoint, inputs.get("messages"), self.name)
        if not self._discovered and (self.model is None or self.max_model_len is None):
            assert self._discovery is not None
            async with self._discovery:  # the first requests ask once, not once each
                if not self._discovered:
                    try:
                        self._use_models(await self._request_whole(client, "GET", f"{self.url}/v1/models"))
                    except EngineProtocolError as exc:
                        raise self._bad_gateway(exc) from None
                    except _transport_errors() as exc:
                        raise self._down(exc) from None
        self.check_budget(messages)
        body = self.request_body(messages)
        assert self._sem is not None
        async with self._sem:
            self.inflight += 1
            try:
                text = await self._generate(client, body, on_token, timing)
            finally:
                self.inflight -= 1
        return {"text": text}

    async def _generate(
        self, client: Any, body: dict[str, Any], on_token: Callable[[str], None] | None, timing: ItemTiming | None
    ) -> str:
        calls = timing.engine_calls if timing is not None else []
        if self.engine_stream is False or (self.engine_stream == "auto" and on_token is None):
            call = CallRecorder(self.name, self.url)
            try:
                resp = await self._post(client, body)
                call.answered(resp.status_code, resp.headers)
                if "text/event-stream" in resp.headers.get("content-type", ""):  # it streams anyway
                    path = openai_api.ENDPOINTS[self.endpoint]
                    reader = ChatStreamReader(call, f"model {self.name!r}: POST {path} at {self.url}", self.max_tokens)
                    reader.feed(resp.content)
                    text = reader.finish()
                    call.first, call.gaps = None, []  # read at once: no token timing to report
                else:
                    text, doc = self._answer(resp)
                    call.chunk(doc)
            except USGError as exc:
                if isinstance(exc, BackendError):  # the engine answered with this status
                    call.status = exc.status
                call.error = str(exc)[:300]
                raise
            except asyncio.CancelledError:  # the request was cancelled: its connection to the engine is closed
                call.error = "cancelled while the engine generated (one whole completion asked)"
                raise
            finally:
                calls.append(call.record())
            if on_token is not None and text:
                on_token(text)
            return text
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        for attempt in range(self.retries + 1):
            call = CallRecorder(self.name, self.url)
            try:
                return await self._stream_once(client, body, on_token, call, attempt)
            except _Retry as retry:
                call.error = f"HTTP {call.status}, retried after {retry.wait_s:g} s"
                wait = retry.wait_s
            except USGError as exc:
                call.error = str(exc)[:300]
                raise
            except asyncio.CancelledError:  # the request was cancelled: its stream to the engine is closed
                call.error = f"cancelled after {call.deltas} token deltas"
                raise
            finally:
                calls.append(call.record())
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _stream_once(
        self,
        client: Any,
        body: dict[str, Any],
        on_token: Callable[[str], None] | None,
        call: CallRecorder,
        attempt: int,
    ) -> str:
        """One streamed request; raises :class:`_Retry` on a 429/503 that may be retried."""
        path = openai_api.ENDPOINTS[self.endpoint]
        where = f"model {self.name!r}: POST {path} at {self.url}"
        try:
            async with client.stream("POST", f"{self.url}{path}", json=body, headers=self._headers()) as resp:
                call.answered(resp.status_code, resp.headers)
                if resp.status_code >= 400:
                    whole = await self._read_whole(resp)
                    if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                        raise _Retry(_retry_after(resp.headers, attempt))
                    raise self._engine_error(whole, f"POST {path}")
                if "text/event-stream" not in resp.headers.get("content-type", ""):
                    # an engine that answers a stream request with one JSON completion
                    text, doc = self._answer(await self._read_whole(resp))
                    call.chunk(doc)
                    if on_token is not None and text:
                        on_token(text)
                    return text
                if isinstance(resp, EngineResponse):  # parsed as it arrives, no task wake-up per chunk
                    reader = ChatStreamReader(call, where, self.max_tokens)
                    await resp.consume(reader.sink(on_token))
                    return reader.finish()
                return await read_chat_stream(resp.aiter_bytes(), call, on_token, where, self.max_tokens)
        except _timeouts():
            raise RequestTimeout(
                f"model {self.name!r}: the engine at {self.url} sent nothing for {self.timeout_s:g} s; "
                "fix: raise options.timeout_s, lower max_tokens, or check the engine's load"
            ) from None
        except EngineProtocolError as exc:
            raise self._bad_gateway(exc) from None
        except _transport_errors() as exc:
            if call.status:  # it answered, then the connection dropped mid-stream
                how = f"with the connection dropped after {call.deltas} token deltas ({exc})"
                raise stream_cut(where, how) from None
            raise self._down(exc) from None

    async def _post(self, client: Any, body: dict[str, Any]) -> Any:
        url = f"{self.url}{openai_api.ENDPOINTS[self.endpoint]}"
        for attempt in range(self.retries + 1):
            try:
                resp = await self._request_whole(client, "POST", url, body)
            except _timeouts():
                raise RequestTimeout(
                    f"model {self.name!r}: the engine at {self.url} did not answer within {self.timeout_s:g} s; "
                    "fix: raise options.timeout_s, lower max_tokens, or check the engine's load"
                ) from None
            except EngineProtocolError as exc:
                raise self._bad_gateway(exc) from None
            except _transport_errors() as exc:
                raise self._down(exc) from None
            if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                await asyncio.sleep(_retry_after(resp.headers, attempt))
                continue
            if resp.status_code >= 400:
                raise self._engine_error(resp, f"POST {openai_api.ENDPOINTS[self.endpoint]}")
            return resp
        raise AssertionError("unreachable")

    async def _request_whole(self, client: Any, method: str, url: str, body: Any = None) -> Any:
        """One request whose answer is read whole, within :data:`MAX_BODY_BYTES` and ``timeout_s``:
        :class:`EngineClient` bounds it itself; httpx (an https engine, or one behind a proxy) reads
        whole bodies however large, so its answer is streamed into :meth:`_read_whole`."""
        if isinstance(client, EngineClient):
            return await client.request(method, url, json=body, headers=self._headers())
        async with client.stream(method, url, json=body, headers=self._headers()) as resp:
            return await self._read_whole(resp)

    async def _read_whole(self, resp: Any) -> Any:
        """The body of a response (an :class:`EngineResponse` or httpx's) read whole, at most
        :data:`MAX_BODY_BYTES` (httpx's decoded bytes: a compressed body is bounded as it inflates)
        within ``timeout_s`` in total: :class:`EngineProtocolError` / :class:`EngineTimeout` past them."""
        if isinstance(resp, EngineResponse):
            await resp.aread()
            return resp
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout_s):
                async for piece in resp.aiter_bytes():
                    body += piece
                    if len(body) > MAX_BODY_BYTES:
                        raise EngineProtocolError(
                            f"the engine at {self.url} sent a body over {MAX_BODY_BYTES} bytes "
                            f"(HTTP {resp.status_code}); fix: check what listens at options.url, or lower max_tokens"
                        )
        except TimeoutError:
            raise EngineTimeout(f"the body from the engine at {self.url} took over {self.timeout_s:g} s") from None
        return _Whole(resp.status_code, resp.headers, bytes(body))

    def _answer(self, resp: Any) -> tuple[str, Any]:
        """The completion's text, and its JSON document (parsed once). Bytes that are not UTF-8 are
        replaced (U+FFFD), as in a streamed answer; an answer that is no completion is a 502."""
        if 300 <= resp.status_code < 400:  # neither client follows redirects: a POST must not be re-sent blindly
            where = resp.headers.get("location", "?")
            err = BackendError(
                f"model {self.name!r}: the engine at {self.url} answered HTTP {resp.status_code}, a redirect to "
                f"{where[:200]}, which is not followed; fix: point options.url at the address it redirects to"
            )
            err.status = 502
            raise err
        try:
            doc = json.loads(resp.content.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):  # RecursionError: nested past the parser
            why = "that is not JSON"
        else:
            try:
                return openai_api.answer_text(self.endpoint, doc), doc
            except (KeyError, IndexError, TypeError):
                why = "without " + ("choices[0].message.content" if self.endpoint == "chat" else "choices[0].text")
        err = BackendError(
            f"model {self.name!r}: the engine at {self.url} sent a completion {why} ({resp.text[:80]!r}); "
            "fix: check that options.url is the engine's OpenAI-compatible address"
        )
        err.status = 502  # the engine broke the protocol: a bad gateway, not a fault of usg serve's
        raise err

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """One item from a worker thread (the executor awaits :meth:`ainfer` instead)."""

        async def once() -> dict[str, Any]:
            try:
                return await self.ainfer(inputs)
            finally:
                await self.aclose()
                self.state = BackendState.LOADED

        return asyncio.run(once())
