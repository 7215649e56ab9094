"""Streaming LLM nodes against the streaming fake engine (a real HTTP server on 127.0.0.1):
executor events, the /v1 SSE wire format, engine faults as error events, cancellation on
disconnect, and the LLM metrics and spans."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

import httpx
import uvicorn
from fake_openai import RunningEngine
from fake_openai_stream import StreamingFakeEngine
from procs import free_port

from usg import BackendError, Executor, GraphError, RequestTimeout, load_graph
from usg.runtime import Finished, TokenDelta
from usg.serve import create_app

GRAPH = """
name: ask
inputs:
  question: {{modality: text}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', model: tiny, max_tokens: 16, timeout_s: {timeout}, retries: 1, engine_stream: {stream}}}
nodes:
  prompt:
    fn: usg.ops.llm:chat
    inputs: {{question: inputs.question}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs:
  answer: answer.text
"""


def _graph(tmp_path: Path, url: str, timeout: float = 30, stream: str = "true") -> Path:
    """The test graph; ``stream`` is options.engine_stream (``true``: the engine streams even for a
    caller that does not, so these tests read its streams through ``infer_sync`` too)."""
    path = tmp_path / "graph.yaml"
    path.write_text(GRAPH.format(url=url, timeout=timeout, stream=stream))
    return path


async def _collect(ex: Executor, inputs: dict[str, Any]) -> list[Any]:
    return [e async for e in ex.stream(inputs)]


def _wait_for(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_executor_stream_yields_nodes_then_tokens_then_the_result(tmp_path: Path) -> None:
    with (
        RunningEngine(StreamingFakeEngine()) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url, stream="auto"))) as ex,
    ):
        events = ex._sync.run(_collect(ex, {"question": "two plus two"}))
        plain = ex.infer_sync({"question": "two plus two"})
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "NodeFinished" and events[0].node == "prompt"
    assert kinds[-2:] == ["NodeFinished", "Finished"] and events[-2].node == "answer"
    tokens = [e for e in events if isinstance(e, TokenDelta)]
    assert [t.text for t in tokens] == ["echo:", " two", " plus", " two"]
    assert {t.node for t in tokens} == {"answer"}
    final = events[-1]
    assert isinstance(final, Finished)
    assert final.result.outputs == plain.outputs == {"answer": "echo: two plus two"}
    # engine_stream auto: the engine streams for the streaming caller, one whole completion for the other
    assert [body.get("stream") for body in engine.bodies] == [True, None]
    assert engine.completed == 1  # streams fully sent


@pytest.mark.parametrize(
    ("mode", "match"),
    [
        ("garbage", "not a Server-Sent Event field: '<html>502"),
        ("bad_json", r"malformed stream chunk \(not JSON\)"),
        ("cut", "ended with the connection dropped after 2 token deltas"),
        ("no_finish", r"ended after 4 token deltas, before the answer finished \(no finish_reason or \[DONE\]\)"),
        ("error_chunk", "the engine failed while generating: CUDA out of memory"),
    ],
)
def test_a_broken_engine_stream_is_a_clear_error_naming_the_node(tmp_path: Path, mode: str, match: str) -> None:
    with (
        RunningEngine(StreamingFakeEngine(mode=mode)) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url))) as ex,
        pytest.raises(BackendError, match=match) as info,
    ):
        ex.infer_sync({"question": "two plus two"})
    assert info.value.node == "answer"
    assert info.value.status == 502
    assert "model 'llm': POST /v1/chat/completions at http://127.0.0.1" in str(info.value)


def test_a_stalled_engine_stream_times_out_instead_of_hanging(tmp_path: Path) -> None:
    with (
        RunningEngine(StreamingFakeEngine(mode="stall")) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url, timeout=0.5))) as ex,
        pytest.raises(RequestTimeout, match=r"the engine at http://\S+ sent nothing for 0.5 s"),
    ):
        ex.infer_sync({"question": "two plus two"})


def test_requests_reuse_the_engine_connection(tmp_path: Path) -> None:
    """The stream is read to its end after ``[DONE]``, so its connection goes back to the pool
    (a response closed unread closes its connection: one TCP connect per question)."""
    with RunningEngine(StreamingFakeEngine()) as engine, Executor(load_graph(_graph(tmp_path, engine.url))) as ex:
        for _ in range(3):
            assert ex.infer_sync({"question": "two plus two"}).outputs == {"answer": "echo: two plus two"}
    assert len(engine.peers) == 3 and len(set(engine.peers)) == 1, engine.peers


def test_an_engine_that_keeps_the_stream_open_after_done_costs_at_most_a_second(tmp_path: Path) -> None:
    with (
        RunningEngine(StreamingFakeEngine(mode="linger")) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url))) as ex,
    ):
        t0 = time.monotonic()
        assert ex.infer_sync({"question": "two plus two"}).outputs == {"answer": "echo: two plus two"}
        assert time.monotonic() - t0 < 10  # the drain after [DONE] gives up after 1 s: no hang
        engine.mode = "ok"
        assert ex.infer_sync({"question": "again"}).outputs == {"answer": "echo: again"}
    assert len(set(engine.peers)) == 2  # that connection was closed, a new one opened


def test_closing_the_stream_early_closes_the_engine_stream(tmp_path: Path) -> None:
    async def first_token(ex: Executor) -> TokenDelta:
        events = ex.stream({"question": "one two three four five six"})
        async for event in events:
            if isinstance(event, TokenDelta):
                await events.aclose()
                return event
        raise AssertionError("no token")

    with (
        RunningEngine(StreamingFakeEngine(token_delay_s=0.2)) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url))) as ex,
    ):
        token = ex._sync.run(first_token(ex))
        _wait_for(lambda: engine.abandoned == 1, "the engine's stream to be closed")
    assert token.text == "echo:"
    assert engine.completed == 0


class RunningApp:
    """``create_app(graph)`` under uvicorn on a free port in a thread (SSE needs a real server)."""

    def __init__(self, graph_path: Path, **kwargs: Any) -> None:
        self.app = create_app(load_graph(graph_path), **kwargs)
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RunningApp:
        self.thread.start()
        _wait_for(lambda: self.server.started, "usg to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    event = "message"
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            yield event, json.loads(line[len("data: ") :])
            event = "message"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StreamingFakeEngine, RunningApp]]:
    """One fake engine and one usg app for the module's HTTP tests (faults are consumed per request)."""
    tmp = tmp_path_factory.mktemp("served")
    with RunningEngine(StreamingFakeEngine()) as engine, RunningApp(_graph(tmp, engine.url)) as app:
        yield engine, app
        assert app.app.state.usg.gate.inflight == 0  # every stream, failed ones too, freed its slot


_LLM_SERIES = {
    'usg_llm_time_to_first_token_seconds_count{model="llm",node="answer"}': 2,
    'usg_llm_inter_token_latency_seconds_count{model="llm",node="answer"}': 6,
    'usg_llm_completion_tokens_total{model="llm",node="answer"}': 8,
    'usg_llm_prompt_tokens_total{model="llm",node="answer"}': 10,
    'usg_llm_engine_requests_total{code="200",model="llm",node="answer"}': 2,
}


def _series(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in _LLM_SERIES or name == 'usg_llm_engine_inflight{model="llm"}':
            values[name] = float(value)
    return values


def test_v1_stream_wire_format_and_the_same_final_object(served: tuple[StreamingFakeEngine, RunningApp]) -> None:
    _, app = served
    before = _series(app.url)
    body = {"inputs": {"question": "two plus two"}}
    with httpx.stream("POST", f"{app.url}/v1/infer", json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(_sse(resp.iter_lines()))
    plain = httpx.post(f"{app.url}/v1/infer", json=body, timeout=30).json()
    names = [e for e, _ in events]
    assert names == ["node", "token", "token", "token", "token", "node", "result"]
    assert events[0][1]["node"] == "prompt" and events[0][1]["ms"] >= 0
    assert [d["text"] for e, d in events if e == "token"] == ["echo:", " two", " plus", " two"]
    result = events[-1][1]
    assert set(result) == set(plain) == {"outputs", "pruned_nodes", "node_ms", "integrity", "request_id"}
    assert result["outputs"] == plain["outputs"] == {"answer": "echo: two plus two"}
    assert result["integrity"] == plain["integrity"] and set(result["node_ms"]) == {"prompt", "answer"}
    after = _series(app.url)
    # two engine calls of 4 deltas each (3 gaps), usage 5 prompt tokens, 4 completion tokens
    assert {k: after[k] - before.get(k, 0.0) for k in _LLM_SERIES} == _LLM_SERIES
    assert after['usg_llm_engine_inflight{model="llm"}'] == 0


def test_v1_stream_errors_before_and_after_the_first_event(served: tuple[StreamingFakeEngine, RunningApp]) -> None:
    engine, app = served
    refused = httpx.post(f"{app.url}/v1/infer", json={"inputs": {"nope": 1}, "stream": True}, timeout=30)
    assert refused.status_code == 400 and refused.headers["content-type"] == "application/json"
    assert "nope" in refused.json()["message"]
    bad_flag = httpx.post(f"{app.url}/v1/infer", json={"inputs": {"question": "q"}, "stream": "yes"}, timeout=30)
    assert bad_flag.status_code == 400 and bad_flag.json()["field"] == "stream"
    # before: a query value other than 1/true/yes was read as false, without a word (the answer came whole)
    for query in ("stream=maybe", "stream=", "stream=1&stream=0"):
        bad_query = httpx.post(f"{app.url}/v1/infer?{query}", files={"question": (None, "q")}, timeout=30)
        assert bad_query.status_code == 400, (query, bad_query.text)
        assert bad_query.json()["field"] == "stream" and "?stream=true" in bad_query.json()["fix"]
    for query, streamed in (("stream=TRUE", True), ("stream=0", False), ("stream=no", False)):
        answer = httpx.post(f"{app.url}/v1/infer?{query}", files={"question": (None, "q")}, timeout=30)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream") is streamed, query
    engine.faults.append((400, {}, {"error": {"message": "max_tokens is too large"}}))
    with httpx.stream(
        "POST", f"{app.url}/v1/infer", json={"inputs": {"question": "q"}, "stream": True}, timeout=30
    ) as resp:
        events = list(_sse(resp.iter_lines()))
    assert [e for e, _ in events] == ["node", "error"]
    error = events[-1][1]
    assert error["status"] == 400 and error["node"] == "answer" and error["request_id"]
    assert "HTTP 400: max_tokens is too large" in error["message"]
    engine.faults.append((404, {}, {"error": {"message": "model tiny not found"}}))
    plain = httpx.post(f"{app.url}/v1/infer", json={"inputs": {"question": "q"}}, timeout=30)
    assert plain.status_code == 404 and plain.json()["node"] == "answer"
    assert "model tiny not found" in plain.json()["message"]


def test_a_client_that_disconnects_cancels_the_engine_request(tmp_path: Path) -> None:
    engine_def = StreamingFakeEngine(token_delay_s=0.2)
    with RunningEngine(engine_def) as engine, RunningApp(_graph(tmp_path, engine.url)) as app:
        body = {"inputs": {"question": "one two three four five six seven"}, "stream": True}
        with httpx.stream("POST", f"{app.url}/v1/infer", json=body, timeout=30) as resp:
            for event, data in _sse(resp.iter_lines()):  # noqa: B007 (data is read after the loop)
                if event == "token":
                    break  # leaving the block closes the connection
        _wait_for(lambda: engine.abandoned == 1, "the engine's stream to be closed")
        ctx = app.app.state.usg
        _wait_for(lambda: ctx.gate.inflight == 0, "the in-flight slot to be freed")
    assert engine.completed == 0 and data["text"] == "echo:"


def test_engine_calls_become_spans_with_the_engine_request_id(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with (
        RunningEngine(StreamingFakeEngine()) as engine,
        RunningApp(_graph(tmp_path, engine.url), tracer_provider=provider) as app,
    ):
        assert httpx.post(f"{app.url}/v1/infer", json={"inputs": {"question": "a b"}}, timeout=30).is_success
    spans = {s.name: s for s in exporter.get_finished_spans()}
    span = spans["engine llm"]
    assert span.attributes is not None
    assert span.attributes["usg.engine.request_id"] == "eng-1"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["usg.engine.completion_tokens"] == 3
    assert span.attributes["usg.engine.finish_reason"] == "stop"
    assert span.parent is not None and span.parent.span_id == spans["node answer"].context.span_id


def test_triton_generate_and_generate_stream(served: tuple[StreamingFakeEngine, RunningApp]) -> None:
    engine, app = served
    base = f"{app.url}/v2/models/ask"
    plain = httpx.post(f"{base}/generate", json={"text_input": "two plus two", "parameters": {"stream": False}})
    assert plain.status_code == 200
    assert plain.json() == {"model_name": "ask", "model_version": "1", "text_output": "echo: two plus two"}
    with httpx.stream("POST", f"{base}/versions/1/generate_stream", json={"text_input": "two plus two"}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [d for _, d in _sse(resp.iter_lines())]
    assert [e["text_output"] for e in events] == ["echo:", " two", " plus", " two", ""]
    assert all(e["model_name"] == "ask" and e["model_version"] == "1" for e in events)
    engine.faults.append((500, {}, {"error": {"message": "engine exploded"}}))
    with httpx.stream("POST", f"{base}/generate_stream", json={"text_input": "q"}) as resp:
        (error,) = [d for _, d in _sse(resp.iter_lines())]
    assert set(error) == {"error"} and "HTTP 500: engine exploded" in error["error"]


def test_triton_generate_refusals(served: tuple[StreamingFakeEngine, RunningApp]) -> None:
    _, app = served
    base = f"{app.url}/v2/models"
    unknown = httpx.post(f"{base}/ask/generate", json={"text_input": "q", "parameters": {"max_tokens": 9}})
    assert unknown.status_code == 400
    assert "parameters ['max_tokens'] are not supported" in unknown.json()["error"]
    assert "graph's model options" in unknown.json()["fix"]
    assert httpx.post(f"{base}/other/generate_stream", json={"text_input": "q"}).status_code == 404
    both = httpx.post(f"{base}/ask/generate", json={"text_input": "q", "question": "q"})
    assert both.status_code == 400 and "text_input and question both fill input 'question'" in both.json()["error"]
    assert httpx.post(f"{base}/ask/generate", json={"question": "by name"}).json()["text_output"] == "echo: by name"


def test_usg_run_stream_prints_tokens_as_they_arrive(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from usg.cli import cli

    with RunningEngine(StreamingFakeEngine()) as engine:
        graph = str(_graph(tmp_path, engine.url))
        shown = CliRunner().invoke(cli, ["run", graph, "-i", "question=two plus two", "--stream"])
        as_json = CliRunner().invoke(cli, ["run", graph, "-i", "question=a b", "--stream", "--json"])
    assert shown.exit_code == 0, shown.output
    assert "[answer] echo: two plus two\n" in shown.stdout
    assert "answer:" not in shown.stdout  # printed once, as it streamed
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["outputs"] == {"answer": "echo: a b"}
    assert "[answer] echo: a b" in as_json.stderr


def test_engine_stream_false_sends_plain_completions_and_one_delta(tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    with RunningEngine(StreamingFakeEngine()) as engine:
        path.write_text(GRAPH.format(url=engine.url, timeout=30, stream="false"))
        with Executor(load_graph(path)) as ex:
            events = ex._sync.run(_collect(ex, {"question": "two plus two"}))
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["echo: two plus two"]
    assert "stream" not in engine.bodies[0] and engine.completed == 0


def test_engine_stream_takes_auto_true_or_false_and_names_the_field_otherwise(tmp_path: Path) -> None:
    with pytest.raises(GraphError) as info, Executor(load_graph(_graph(tmp_path, "http://127.0.0.1:9", stream="x"))):
        pass
    text = str(info.value)
    assert "models.llm.options.engine_stream" in text and "'x'" in text and "auto" in text


def test_a_caller_that_does_not_stream_gets_no_token_timing_from_an_engine_that_streams_anyway(
    tmp_path: Path,
) -> None:
    """engine_stream auto asks for one completion; an engine (or a proxy) that streams it anyway is
    read whole, so its deltas carry no time to first token (they were not seen as they came)."""
    from usg.runtime.observer import Observer

    seen: list[Any] = []

    class Calls(Observer):
        def node_finished(self, event: Any) -> None:
            seen.extend(event.engine_calls)

    with (
        RunningEngine(StreamingFakeEngine(always_stream=True)) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url, stream="auto")), observers=[Calls()]) as ex,
    ):
        result = ex.infer_sync({"question": "two plus two"})
    assert result.outputs == {"answer": "echo: two plus two"}
    assert engine.completed == 1 and "stream" not in engine.bodies[0]
    (call,) = seen
    assert call.status == 200 and call.finish_reason == "stop"
    assert call.first_token is None and call.token_gaps_s == () and call.completion_tokens == 4


def test_a_text_only_prompt_is_built_on_the_event_loop(tmp_path: Path) -> None:
    """ops declared ``inline`` for some inputs skip the worker-thread hop for those (chat: no image)."""
    import threading

    from usg.ops.llm import chat
    from usg.ops.signature import op, signature_of

    threads: list[str] = []
    sig = signature_of(chat)
    assert sig is not None and sig.inline is not None

    @op(inputs=sig.inputs, outputs=sig.outputs, inline=sig.inline)
    def recorded(**kwargs: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return chat(**kwargs)

    with (
        RunningEngine(StreamingFakeEngine()) as engine,
        Executor(load_graph(_graph(tmp_path, engine.url)), fns={"prompt": recorded}) as ex,
    ):
        assert ex.infer_sync({"question": "q"}).outputs == {"answer": "echo: q"}
    assert len(threads) == 1 and not threads[0].startswith("usg-worker")
    assert sig.inline({"question": "q"}) and not sig.inline({"image": object()})


def test_an_engine_behind_an_http_proxy_is_reached_through_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP_PROXY set for the engine's URL, requests go through the proxy (httpx), as before
    USG had its own client: here the "proxy" is the engine itself, and the engine's host does not
    resolve, so only a proxied request can be answered."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with RunningEngine(StreamingFakeEngine()) as engine:
        monkeypatch.setenv("HTTP_PROXY", engine.url)
        with Executor(load_graph(_graph(tmp_path, "http://engine.invalid:9"))) as ex:
            assert ex.infer_sync({"question": "two plus two"}).outputs == {"answer": "echo: two plus two"}
    assert engine.completed == 1
