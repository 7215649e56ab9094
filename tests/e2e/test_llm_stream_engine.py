"""Streaming against a real engine: ``usg serve`` in front of ``transformers serve`` (a tiny random
Llama, greedy decoding): the SSE event order, Triton's generate extension, a disconnect that
stops the engine's generation, an engine that is down, and the LLM metrics."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Server, start_server
from procs import ServerProcess, free_port

pytestmark = pytest.mark.slow
httpx = pytest.importorskip("httpx")

GRAPH = """
name: ask
inputs:
  question: {{modality: text, optional: true}}
  topic: {{modality: text, optional: true}}
  ping: {{modality: text, optional: true}}
models:
  llm:
    backend: openai
    options: {{url: '{url}', max_tokens: 8, max_model_len: 512, max_inflight: 2, timeout_s: 120}}
  essayist:
    backend: openai
    options: {{url: '{url}', max_tokens: 300, max_model_len: 512, timeout_s: 120}}
  gone:
    backend: openai
    options: {{url: 'http://127.0.0.1:{dead}', model: tiny, retries: 0, max_model_len: 512}}
nodes:
  prompt: {{fn: "usg.ops.llm:chat", inputs: {{question: inputs.question}}, options: {{system: "Be brief."}}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
  eprompt: {{fn: "usg.ops.llm:chat", inputs: {{question: inputs.topic}}, options: {{user: "Write about {{question}}"}}}}
  essay: {{model: essayist, inputs: {{messages: eprompt.messages}}}}
  pprompt: {{fn: "usg.ops.llm:chat", inputs: {{question: inputs.ping}}}}
  pong: {{model: gone, inputs: {{messages: pprompt.messages}}}}
outputs:
  answer: answer.text
  essay: essay.text
  pong: pong.text
"""


@pytest.fixture(scope="module")
def usg(llm_engine: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("usg-llm")
    graph = tmp / "graph.yaml"
    graph.write_text(GRAPH.format(url=f"http://127.0.0.1:{llm_engine.port}", dead=free_port()))
    server = start_server(graph, tmp=tmp)
    yield server
    assert server.stop() == 0, server.output()


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    event = "message"
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            yield event, json.loads(line[len("data: ") :])
            event = "message"


def _probe_lines(engine: ServerProcess) -> list[str]:
    return re.findall(r"usg-probe: generation \w+ after \d+ tokens", engine.output())


def test_v1_stream_against_the_engine(usg: Server) -> None:
    body: dict[str, Any] = {"inputs": {"question": "What is the total?"}}
    with httpx.stream("POST", f"{usg.url}/v1/infer", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200
        events = list(_sse(resp.iter_lines()))
    plain = httpx.post(f"{usg.url}/v1/infer", json=body, timeout=120).json()
    names = [e for e, _ in events]
    assert names[0] == "node" and events[0][1]["node"] == "prompt"
    assert names[-2:] == ["node", "result"] and events[-2][1]["node"] == "answer"
    tokens = [d for e, d in events if e == "token"]
    assert names[1:-2] == ["token"] * len(tokens) and len(tokens) >= 1
    assert {t["node"] for t in tokens} == {"answer"}
    result = events[-1][1]
    assert "".join(t["text"] for t in tokens) == result["outputs"]["answer"]
    assert set(result) == set(plain)
    assert result["outputs"] == plain["outputs"]  # greedy decoding: the same answer both ways
    assert {"eprompt", "essay", "pprompt", "pong"} <= set(result["pruned_nodes"])


def test_triton_generate_against_the_engine(usg: Server) -> None:
    base = f"{usg.url}/v2/models/ask"
    plain = httpx.post(f"{base}/generate", json={"question": "Hello there"}, timeout=120)  # by name: 3 text inputs
    assert plain.status_code == 200, plain.text
    whole = plain.json()
    assert whole["model_name"] == "ask" and whole["model_version"] == "1" and whole["text_output"]
    with httpx.stream("POST", f"{base}/generate_stream", json={"question": "Hello there"}, timeout=120) as resp:
        assert resp.status_code == 200
        parts = [d for _, d in _sse(resp.iter_lines())]
    assert len(parts) >= 2 and parts[-1]["text_output"] == ""
    assert "".join(p["text_output"] for p in parts) == whole["text_output"]


def test_a_disconnect_stops_the_engine_generating(usg: Server, llm_engine: ServerProcess) -> None:
    if "usg-probe: installed" not in llm_engine.output():
        pytest.skip("the engine probe could not hook this transformers version")
    before = len(_probe_lines(llm_engine))
    body = {"inputs": {"topic": "the sea"}, "stream": True}
    with httpx.stream("POST", f"{usg.url}/v1/infer", json=body, timeout=120) as resp:
        for event, data in _sse(resp.iter_lines()):
            if event == "token":
                assert data["node"] == "essay"
                break  # leaving the block drops the connection, 299 tokens before max_tokens
    deadline = time.monotonic() + 60
    while len(_probe_lines(llm_engine)) == before:
        assert time.monotonic() < deadline, f"the engine never stopped:\n{llm_engine.output()[-2000:]}"
        time.sleep(0.1)
    (line,) = _probe_lines(llm_engine)[before:]
    tokens = int(line.split()[-2])
    assert "cancelled" in line and tokens < 300, line  # stopped, not run to max_tokens
    metrics = httpx.get(f"{usg.url}/metrics").text
    assert 'usg_llm_engine_inflight{model="essayist"} 0.0' in metrics  # USG's slot was freed too


def test_an_engine_that_is_down_is_a_503_naming_model_url_and_fix(usg: Server) -> None:
    resp = httpx.post(f"{usg.url}/v1/infer", json={"inputs": {"ping": "hi"}}, timeout=60)
    assert resp.status_code == 503
    body = resp.json()
    assert body["node"] == "pong"
    assert re.search(
        r"model 'gone' \(engine model tiny\): the engine at http://127.0.0.1:\d+ is not reachable", body["message"]
    )
    assert "fix: start it" in body["message"]
    with httpx.stream("POST", f"{usg.url}/v1/infer", json={"inputs": {"ping": "hi"}, "stream": True}) as r:
        events = list(_sse(r.iter_lines()))
    assert [e for e, _ in events] == ["node", "error"]
    assert events[-1][1]["status"] == 503 and events[-1][1]["node"] == "pong"


def test_llm_metrics_after_real_engine_calls(usg: Server) -> None:
    """engine_stream auto: a question asked without streaming is one whole completion (tokens and
    status counted, no token timing); a streamed one times its first token and the gaps."""
    ttft = 'usg_llm_time_to_first_token_seconds_count{model="llm",node="answer"}'
    itl = 'usg_llm_inter_token_latency_seconds_count{model="llm",node="answer"}'
    out = 'usg_llm_completion_tokens_total{model="llm",node="answer"}'

    def values() -> dict[str, float]:
        text = httpx.get(f"{usg.url}/metrics").text
        found = {s: re.search(re.escape(s) + r" (\S+)", text) for s in (ttft, itl, out)}
        return {s: float(m.group(1)) if m else 0.0 for s, m in found.items()}

    before = values()
    assert httpx.post(f"{usg.url}/v1/infer", json={"inputs": {"question": "q"}}, timeout=120).is_success
    plain = values()
    assert plain[ttft] == before[ttft] and plain[itl] == before[itl]
    assert plain[out] >= before[out] + 1  # the engine's usage of the whole completion
    streamed_q = {"inputs": {"question": "q"}, "stream": True}
    with httpx.stream("POST", f"{usg.url}/v1/infer", json=streamed_q, timeout=120) as r:
        assert r.status_code == 200 and "event: token" in list(r.iter_lines())
    streamed = values()
    assert streamed[ttft] == plain[ttft] + 1 and streamed[itl] > plain[itl]
    metrics = httpx.get(f"{usg.url}/metrics").text

    def value(series: str) -> float:
        match = re.search(re.escape(series) + r" (\S+)", metrics)
        assert match, series
        return float(match.group(1))

    assert value('usg_llm_completion_tokens_total{model="llm",node="answer"}') >= 8
    assert value('usg_llm_prompt_tokens_total{model="llm",node="answer"}') >= 1
    assert value('usg_llm_engine_requests_total{code="200",model="llm",node="answer"}') >= 1
    assert value('usg_llm_engine_requests_total{code="none",model="gone",node="pong"}') >= 1
