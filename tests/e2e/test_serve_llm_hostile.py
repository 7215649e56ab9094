"""A real ``usg serve`` with an LLM node (``backend: openai``) in front of a fake engine (it plays the
party that misbehaves or is left waiting): what a client going away does to the engine's work."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fake_openai import FakeEngine, RunningEngine
from harness import Server, start_server

GRAPH = """
name: ask
inputs: {{question: {{modality: text}}}}
models:
  llm: {{backend: openai, options: {{url: '{url}', max_tokens: 8, max_model_len: 512, timeout_s: 120}}}}
nodes:
  prompt: {{fn: "usg.ops.llm:chat", inputs: {{question: inputs.question}}}}
  answer: {{model: llm, inputs: {{messages: prompt.messages}}}}
outputs: {{answer: answer.text}}
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with RunningEngine(FakeEngine(hold=True)) as running:
        yield running


@pytest.fixture(scope="module")
def usg(engine: FakeEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("usg-llm-hostile")
    graph = tmp / "graph.yaml"
    graph.write_text(GRAPH.format(url=engine.url))
    server = start_server(graph, tmp=tmp)
    yield server
    assert server.stop() == 0, server.output()


def _inflight(server: Server) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("usg_inflight_requests "):
            return float(line.split()[1])
    raise AssertionError("no usg_inflight_requests")


def _wait_for(what: str, check: object, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/infer", {"inputs": {"question": "hi"}}),
        ("/v2/models/ask/generate", {"text_input": "hi"}),
        ("/v2/models/ask/infer", {"inputs": [{"name": "question", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}),
    ],
    ids=["v1", "generate", "v2-infer"],
)
def test_a_client_that_leaves_a_whole_answer_request_stops_the_engine_request(
    usg: Server, engine: FakeEngine, path: str, body: dict[str, object]
) -> None:
    # before: the request ran on with nobody to answer, its slot held and the engine generating,
    # until the engine answered or the request's deadline (60 s) passed
    before, asked = engine.closed_early, len(engine.bodies)
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", usg.port), timeout=30) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), len(raw), raw)
        )
        _wait_for("the request never reached the engine", lambda: len(engine.bodies) > asked)
        assert _inflight(usg) == 1
    _wait_for("the engine's connection was not closed", lambda: engine.closed_early > before)
    _wait_for("the request's slot was not freed", lambda: _inflight(usg) == 0)
    assert "Traceback" not in usg.output() and "Exception in ASGI application" not in usg.output()
