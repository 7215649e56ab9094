"""backend: openai against a fake OpenAI-compatible engine (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from fake_openai import FakeEngine, RunningEngine
from procs import free_port

from usg import BackendError, Executor, GraphError, Overloaded, PayloadTooLarge, StateError, load_graph
from usg.serve.errors import v1_error

GRAPH = """
name: ask
inputs:
  question: {{modality: text}}
  image: {{modality: image, optional: true}}
models:
  llm:
    backend: openai
    options: {{{options}}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question}}
    options: {{system: "Be brief.", user: "Q: {{question}}"}}
  vprompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question, image: inputs.image}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
  vanswer: {{model: llm, inputs: {{messages: vprompt.messages}}}}
outputs:
  answer: answer.text
  vanswer: vanswer.text
"""


def _graph(tmp_path: Path, options: str) -> Path:
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(options=options))
    return path


def _ask(path: Path, inputs: dict[str, object]) -> dict[str, object]:
    with Executor(load_graph(path)) as ex:
        return ex.infer_sync(inputs).outputs


def test_request_structure_and_model_from_the_engine(tmp_path: Path) -> None:
    with RunningEngine(FakeEngine()) as engine:
        out = _ask(_graph(tmp_path, f"url: '{engine.url}/v1', max_tokens: 17"), {"question": "2+2?"})
    assert out == {"answer": "echo: Q: 2+2?"}
    (body,) = engine.bodies
    assert body["model"] == "tiny"  # the only model /v1/models lists
    assert body["max_tokens"] == 17
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2+2?"}]


def test_image_goes_as_a_png_data_url(tmp_path: Path) -> None:
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    with RunningEngine(FakeEngine()) as engine:
        out = _ask(_graph(tmp_path, f"url: '{engine.url}', model: tiny"), {"question": "what?", "image": image})
    assert out["vanswer"] == "echo: what?"
    vision = [b for b in engine.bodies if isinstance(b["messages"][-1]["content"], list)]
    (parts,) = [b["messages"][-1]["content"] for b in vision]
    assert parts[0]["type"] == "image_url"
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert parts[1] == {"type": "text", "text": "what?"}


def test_retries_on_429_honouring_retry_after(tmp_path: Path) -> None:
    busy = (429, {"Retry-After": "0"}, {"error": {"message": "busy"}})
    unavailable = (503, {"Retry-After": "0"}, {"error": {"message": "warming up"}})
    with RunningEngine(FakeEngine(faults=[busy, unavailable])) as engine:
        out = _ask(_graph(tmp_path, f"url: '{engine.url}', retries: 2"), {"question": "hi"})
    assert out == {"answer": "echo: Q: hi"}
    assert len(engine.bodies) == 3


def test_retries_run_out_and_the_engine_status_is_passed_on(tmp_path: Path) -> None:
    busy = (429, {"Retry-After": "0"}, {"error": {"message": "too many requests"}})
    with (
        RunningEngine(FakeEngine(faults=[busy, busy])) as engine,
        pytest.raises(Overloaded, match="HTTP 429: too many requests") as info,
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}', retries: 1"), {"question": "hi"})
    assert info.value.status == 429
    assert len(engine.bodies) == 2


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"), [(429, "7", 7.0), (503, None, 1.0), (429, "99999999", 30.0)]
)
def test_an_engine_still_busy_when_retries_run_out_is_overloaded_with_a_retry_after(
    tmp_path: Path, status: int, retry_after: str | None, expected: float
) -> None:
    # before: a BackendError with the engine's status, so the client got a 429 (or 503) without
    # Retry-After, and no fix; the rejections metric did not count it
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    busy = (status, headers, {"error": {"message": "busy"}})
    with (
        RunningEngine(FakeEngine(faults=[busy])) as engine,
        pytest.raises(Overloaded, match=rf"HTTP {status}: busy.*fix: retry after") as info,
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}', retries: 0"), {"question": "hi"})
    assert info.value.status == status and info.value.retry_after == expected
    response = v1_error(info.value, "rid")
    assert response.status_code == status and response.headers["retry-after"] == str(int(expected))


def test_engine_error_is_passed_on_with_status_and_message(tmp_path: Path) -> None:
    bad = (400, {}, {"error": {"message": "messages: unknown role 'robot'"}})
    with (
        RunningEngine(FakeEngine(faults=[bad])) as engine,
        pytest.raises(BackendError, match=r"model 'llm'.*HTTP 400: messages: unknown role 'robot'") as info,
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})
    assert info.value.status == 400
    assert len(engine.bodies) == 1  # a 4xx is not retried


@pytest.mark.parametrize(
    ("status", "headers", "payload", "why"),
    [
        (200, {}, {"choices": []}, "without choices[0].message.content"),
        (200, {"content-type": "text/html"}, b"<html>Bad Gateway</html>", "that is not JSON"),
        (200, {}, [1, 2], "without choices[0].message.content"),
        (307, {"location": "http://10.0.0.9:8000/v1/chat/completions"}, b"", "HTTP 307, a redirect to http://10.0.0.9"),
    ],
    ids=["no-choices", "html", "list", "redirect"],
)
def test_an_answer_that_is_not_a_completion_is_a_502_saying_why(
    tmp_path: Path, status: int, headers: dict[str, str], payload: object, why: str
) -> None:
    # before: a 500 (a fault of usg serve's, to its clients and metrics), and a redirect or a body that
    # is not JSON were described as "a completion without choices[0].message.content"
    with (
        RunningEngine(FakeEngine(faults=[(status, headers, payload)])) as engine,
        pytest.raises(BackendError, match=re.escape(why)) as info,
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})
    assert info.value.status == 502 and "fix: " in str(info.value)
    if status == 307:
        assert "point options.url at" in str(info.value)


def test_answers_nested_past_the_parser_are_not_json(tmp_path: Path) -> None:
    # before: json's RecursionError escaped: a 500 "internal error (RecursionError)" and a traceback
    deep = b"[" * 100_000
    faults = [(200, {}, b'{"choices": ' + deep), (400, {}, b'{"error": ' + deep)]
    with RunningEngine(FakeEngine(faults=faults)) as engine:
        options = f"url: '{engine.url}'"
        with pytest.raises(BackendError, match="that is not JSON") as info:
            _ask(_graph(tmp_path, options), {"question": "hi"})
        assert info.value.status == 502
        with pytest.raises(BackendError, match=r"HTTP 400: \{\"error\": \[\[") as info:
            _ask(_graph(tmp_path, options), {"question": "hi"})
        assert info.value.status == 400
    with (
        RunningEngine(FakeEngine(models_body=b'{"data": ' + deep)) as engine,
        pytest.raises(BackendError, match="GET /v1/models with not JSON"),
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})


def test_an_answer_that_is_not_utf8_is_read_as_a_streamed_one_is(tmp_path: Path) -> None:
    # a streamed answer's bytes that are not UTF-8 were replaced (U+FFFD) while the same answer read
    # whole was refused (a 500 saying it had no choices[0].message.content)
    bad = (200, {}, b'{"choices": [{"message": {"content": "caf\xe9"}}]}')
    with RunningEngine(FakeEngine(faults=[bad])) as engine:
        assert _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"}) == {"answer": "caf\ufffd"}


def test_engine_down_is_a_503_naming_model_url_and_fix(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StateError, match=rf"model 'llm'.*{url} is not reachable.*fix: start it") as info:
        _ask(_graph(tmp_path, f"url: '{url}', model: tiny"), {"question": "hi"})
    assert info.value.status == 503


def test_budget_refused_before_anything_is_sent(tmp_path: Path) -> None:
    engine_models = [{"id": "tiny", "max_model_len": 64}]
    with RunningEngine(FakeEngine(models=engine_models)) as engine:
        too_long = r"prompt \d+ text tokens \(estimated.*max_tokens 32 = \d+, above.*64"
        with pytest.raises(PayloadTooLarge, match=too_long) as info:
            _ask(_graph(tmp_path, f"url: '{engine.url}', max_tokens: 32"), {"question": "word " * 40})
        assert info.value.status == 413
        assert engine.bodies == []
        # a short question fits the same budget
        assert _ask(_graph(tmp_path, f"url: '{engine.url}', max_tokens: 32"), {"question": "hi"})["answer"]


def test_declared_max_model_len_and_the_models_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "word": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    opts = f"url: '{{url}}', max_model_len: 60, max_tokens: 10, tokenizer: '{tmp_path / 'tokenizer.json'}'"
    with RunningEngine(FakeEngine(models=[{"id": "tiny"}])) as engine:
        with pytest.raises(PayloadTooLarge, match=r"counted with the model's tokenizer.*max_model_len 60"):
            _ask(_graph(tmp_path, opts.format(url=engine.url)), {"question": "word " * 40})
        assert engine.bodies == []


def test_several_models_without_options_model(tmp_path: Path) -> None:
    with (
        RunningEngine(FakeEngine(models=[{"id": "a"}, {"id": "b"}])) as engine,
        pytest.raises(StateError, match=r"lists 2 models \['a', 'b'\]; fix: name one with options.model"),
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})


def test_no_url_is_a_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match=r"models.llm.options.url.*without a url"):
        _ask(_graph(tmp_path, "model: tiny"), {"question": "hi"})


def test_a_url_without_a_scheme_is_a_graph_error_naming_the_fix(tmp_path: Path) -> None:
    # USG_LLM_URL=127.0.0.1:8000 (no http://) failed at the first request as "the engine ... is not
    # reachable (UnsupportedProtocol ...); fix: start it", which sends the reader after the engine
    with pytest.raises(GraphError, match=r"models.llm.options.url: url '127.0.0.1:8000' is not an http") as exc:
        _ask(_graph(tmp_path, "url: '127.0.0.1:8000', model: tiny"), {"question": "hi"})
    assert str(exc.value).startswith(f"graph {str(tmp_path / 'graph.yaml')!r} is invalid")  # was "graph is invalid"
    assert "fix: write the scheme too, e.g. url: http://127.0.0.1:8000" in str(exc.value)


@pytest.mark.parametrize(
    ("option", "fix"),
    [
        ("max_tokens: lots", "use a whole number >= 1 (default 256)"),
        ("timeout_s: soon", "use a number of seconds > 0 (default 120.0)"),
        ("max_inflight: many", "use a whole number >= 1 (default 8)"),
        ("retries: 1.5", "use a whole number >= 0 (default 3)"),
        ("timeout_s: .nan", "use a number of seconds > 0"),
    ],
)
def test_a_numeric_option_that_is_not_one_is_a_graph_error(tmp_path: Path, option: str, fix: str) -> None:
    # max_tokens: lots / timeout_s: soon were internal errors (ValueError) when the executor started
    key = option.split(":")[0]
    with pytest.raises(GraphError, match=rf"models.llm.options.{key}: {key} is ") as exc:
        _ask(_graph(tmp_path, f"url: 'http://127.0.0.1:9', model: tiny, {option}"), {"question": "hi"})
    assert fix in str(exc.value)


def test_max_inflight_caps_what_the_engine_sees(tmp_path: Path) -> None:
    with RunningEngine(FakeEngine(delay_s=0.05)) as engine:
        graph = load_graph(_graph(tmp_path, f"url: '{engine.url}', max_inflight: 3"))

        async def main() -> list[object]:
            async with Executor(graph) as ex:
                results = await asyncio.gather(*(ex.infer({"question": f"q{i}"}) for i in range(32)))
            return [r.outputs["answer"] for r in results]

        answers = asyncio.run(main())
    assert answers == [f"echo: Q: q{i}" for i in range(32)]
    assert len(engine.bodies) == 32
    assert engine.max_seen == 3  # never more than max_inflight at the engine, and the cap was used


def test_an_engine_without_v1_models_needs_options_model(tmp_path: Path) -> None:
    with RunningEngine(FakeEngine(models_status=404)) as engine:
        assert _ask(_graph(tmp_path, f"url: '{engine.url}', model: named"), {"question": "hi"})["answer"]
        assert engine.bodies[0]["model"] == "named"
        with pytest.raises(BackendError, match=r"GET /v1/models with HTTP 404"):
            _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"[1, 2, 3]", "a list"),  # before: AttributeError ('list' object has no attribute 'get')
        (b'{"data": "tiny"}', "data is a str"),  # before: "lists 0 models []"
        (b"<html>nginx</html>", "not JSON"),  # before: JSONDecodeError
        (b'{"data": [{"id": 7}]}', "an id that is not a string"),
    ],
)
def test_a_models_list_that_is_not_one_is_a_502_naming_the_fix(tmp_path: Path, body: bytes, what: str) -> None:
    with RunningEngine(FakeEngine(models_body=body)) as engine:
        with pytest.raises(BackendError, match="GET /v1/models") as info:
            _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})
        assert info.value.status == 502
        message = str(info.value)
        assert "not an OpenAI model list" in message and what in message
        assert "options.model" in message  # the fix: name the model (then the list is not needed)
        # with the model named, a list that is not one is not needed: the declared options stand
        assert _ask(_graph(tmp_path, f"url: '{engine.url}', model: named"), {"question": "hi"})["answer"]
        assert engine.bodies[-1]["model"] == "named"


@pytest.mark.parametrize("length", ['"lots"', "true", "-5", "1e400", "4096.5"])
def test_a_max_model_len_that_is_not_a_positive_integer_is_not_used(tmp_path: Path, length: str) -> None:
    # before: int("lots") raised ValueError (a traceback at start-up, a 500 at the first request),
    # and true was read as a max_model_len of 1, which refused every prompt as too long
    body = f'{{"object": "list", "data": [{{"id": "tiny", "max_model_len": {length}}}]}}'.encode()
    with RunningEngine(FakeEngine(models_body=body)) as engine:
        assert _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"}) == {"answer": "echo: Q: hi"}


def test_a_models_list_over_the_body_limit_is_a_502_at_load(tmp_path: Path) -> None:
    from usg.backends.engine_http import MAX_BODY_BYTES

    # before: read whole at start-up however large (the first request's read was bounded already)
    body = b'{"data": [' + b" " * MAX_BODY_BYTES + b"]}"
    with (
        RunningEngine(FakeEngine(models_body=body)) as engine,
        pytest.raises(BackendError, match=f"over {MAX_BODY_BYTES} bytes for GET /v1/models") as info,
    ):
        _ask(_graph(tmp_path, f"url: '{engine.url}'"), {"question": "hi"})
    assert info.value.status == 502


@pytest.mark.parametrize("endpoint_stream", ["false", "true"])
def test_a_whole_answer_through_httpx_is_bounded_as_through_usgs_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint_stream: str
) -> None:
    # An engine behind an HTTP proxy (or at https://) is read with httpx. Before, its whole answers
    # (a completion, an error, a JSON answer to a stream request) were read however large: a 300 MB
    # completion grew usg serve by 900 MB; usg's own client stops at MAX_BODY_BYTES.
    from usg.backends.engine_http import MAX_BODY_BYTES

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    huge = b'{"choices": [{"message": {"content": "' + b"x" * MAX_BODY_BYTES + b'"}}]}'
    with RunningEngine(FakeEngine(faults=[(200, {}, huge)])) as engine:
        monkeypatch.setenv("HTTP_PROXY", engine.url)  # the "proxy" is the engine: only httpx reaches it
        options = f"url: 'http://engine.invalid:9', model: tiny, engine_stream: {endpoint_stream}"
        with pytest.raises(BackendError, match=f"over {MAX_BODY_BYTES} bytes") as info:
            _ask(_graph(tmp_path, options), {"question": "hi"})
        assert info.value.status == 502
        assert _ask(_graph(tmp_path, options), {"question": "hi"}) == {"answer": "echo: Q: hi"}


def test_httpx_asks_the_engine_for_uncompressed_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx asked for gzip: a compressed answer inflates before the size bound sees it (a 1 MiB chunk of gzip'd
    # zeros is ~1 GiB). Through a proxy (or at https://) USG now asks for identity, as its own client does.
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with RunningEngine(FakeEngine()) as engine:
        monkeypatch.setenv("HTTP_PROXY", engine.url)  # the "proxy" is the engine: only httpx reaches it
        options = "url: 'http://engine.invalid:9', model: tiny, engine_stream: false"
        assert _ask(_graph(tmp_path, options), {"question": "hi"}) == {"answer": "echo: Q: hi"}
        assert engine.encodings == ["identity"]
