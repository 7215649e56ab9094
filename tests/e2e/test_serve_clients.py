"""A real ``usg serve`` against slow clients (slowloris, D10), with an API key, and on a busy port."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from harness import ROOT, SERVE_RESOURCES, USG, Server, start_server
from procs import free_port


def _stalled(port: int, kind: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if kind == "body":  # complete headers, 10 of 100000 body bytes, then nothing
        s.sendall(
            b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"inputs":'
        )
    elif kind == "headers":  # half a request line
        s.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-")
    return s  # kind "idle": connected, sends nothing


def _closed_by_server(s: socket.socket, within_s: float) -> bool:
    """True when the server closed the socket (EOF, possibly after a 408 answer) within ``within_s``."""
    s.settimeout(within_s)
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


@pytest.mark.slow
def test_d10_slowloris_of_50_sockets_holds_no_slot_and_is_closed(
    serve: Callable[..., Server], slow_graph: Path
) -> None:
    server = serve(slow_graph, "--max-inflight", "8", "--header-timeout", "2", "--body-timeout", "3")
    kinds = ["body"] * 20 + ["headers"] * 20 + ["idle"] * 10
    stalled = [_stalled(server.port, k) for k in kinds]
    try:
        time.sleep(0.3)  # the stalled bodies are inside the app now, waiting
        with httpx.Client(timeout=10) as client:
            codes = [
                client.post(f"{server.url}/v1/infer", json={"inputs": {"text": f"q{i}"}}).status_code for i in range(40)
            ]
        assert codes == [200] * 40  # none refused: stalled uploads hold no in-flight slot
        closed = [_closed_by_server(s, within_s=8.0) for s in stalled]
        assert all(closed), [k for k, c in zip(kinds, closed, strict=True) if not c]
    finally:
        for s in stalled:
            s.close()
    metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert 'usg_rejected_requests_total{reason="slow_client"} 20.0' in metrics
    assert 'usg_http_requests_total{code="408",endpoint="v1_infer"} 20.0' in metrics


def test_a_stalled_body_gets_408_with_a_json_body(serve: Callable[..., Server], slow_graph: Path) -> None:
    server = serve(slow_graph, "--body-timeout", "1")
    s = _stalled(server.port, "body")
    try:
        s.settimeout(10)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data
    assert b'"error":"body_timeout"' in body


def test_api_key_guards_inference_and_metrics_not_health(tmp_path: Path, slow_graph: Path) -> None:
    env = {**os.environ, "USG_TEST_KEY": "s3cret-key"}
    server = start_server(slow_graph, "--api-key-env", "USG_TEST_KEY", tmp=tmp_path, env=env)
    try:
        url = server.url
        assert httpx.get(f"{url}/v2/health/live", timeout=5).status_code == 200
        assert httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
            r = httpx.post(f"{url}/v1/infer", json={"inputs": {"text": "x"}}, headers=bad, timeout=5)
            assert r.status_code == 401 and "Authorization: Bearer" in r.json()["message"], r.text
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.get(f"{url}/metrics", timeout=5)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        v2 = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
        r = httpx.post(f"{url}/v2/models/slow/infer", json=v2, timeout=5)
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        good = {"Authorization": "Bearer s3cret-key"}
        r = httpx.post(f"{url}/v1/infer", json={"inputs": {"text": "x"}}, headers=good, timeout=5)
        assert r.status_code == 200 and r.json()["outputs"]["echo"] == "x"
        assert httpx.get(f"{url}/metrics", headers=good, timeout=5).status_code == 200
    finally:
        assert server.stop() == 0


def test_api_key_env_that_is_not_set_is_a_usage_error(slow_graph: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "USG_UNSET_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SERVE_RESOURCES), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [str(USG), "serve", str(slow_graph), "--api-key-env", "USG_UNSET_KEY", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "USG_UNSET_KEY is not set" in out.stderr and "fix: export USG_UNSET_KEY=" in out.stderr


def test_busy_port_fails_before_loading_models_with_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [str(USG), "serve", str(ROOT / "examples" / "document_ocr" / "graph.yaml"), "--port", str(port)],
            capture_output=True,
            text=True,
            env={**os.environ, "USG_CACHE": os.environ.get("USG_CACHE", "/tmp/usgcache")},
            timeout=60,
        )
    assert out.returncode == 1, out
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr and "fix: pass a free --port" in out.stderr
    assert "serving graph" not in out.stderr  # refused before the graph was loaded


def test_a_model_that_cannot_load_fails_start_up_with_its_message_and_no_traceback(tmp_path: Path) -> None:
    from fake_openai import FakeEngine, RunningEngine

    graph = tmp_path / "graph.yaml"
    with RunningEngine(FakeEngine(models=[{"id": "a"}, {"id": "b"}])) as engine:
        graph.write_text(
            "name: ask\ninputs: {question: {modality: text}}\n"
            f"models: {{llm: {{backend: openai, options: {{url: '{engine.url}'}}}}}}\n"
            "nodes:\n  prompt: {fn: 'usg.ops.llm:chat', inputs: {question: inputs.question}}\n"
            "  answer: {model: llm, inputs: {messages: prompt.messages}}\noutputs: {answer: answer.text}\n"
        )
        out = subprocess.run(
            [str(USG), "serve", str(graph), "--port", str(free_port())],
            capture_output=True,
            text=True,
            env={**os.environ, "USG_CACHE": os.environ.get("USG_CACHE", "/tmp/usgcache")},
            timeout=60,
        )
    assert out.returncode != 0, out
    # before: uvicorn printed the lifespan's traceback (20 lines of starlette, the executor and the
    # backend) with the message on its last line
    assert "lists 2 models ['a', 'b']" in out.stderr and "fix: name one with options.model" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_a_trickling_body_and_trickling_headers_are_cut_off(serve: Callable[..., Server], slow_graph: Path) -> None:
    server = serve(slow_graph, "--body-timeout", "2", "--header-timeout", "2")
    for start in (
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
        b"POST /v1/infer HTTP/1.1\r\n",
    ):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            s.sendall(start)
            answer = b""
            closed = False
            for _ in range(40):  # one byte every 0.25 s for up to 10 s: never idle, never done
                try:
                    s.sendall(b"x")
                except OSError:
                    closed = True
                    break
                s.settimeout(0.25)
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                answer += chunk
            assert closed, answer
            if b"Content-Length: 100000" in start:
                assert answer.startswith(b"HTTP/1.1 408"), answer
        finally:
            s.close()


def _answer(s: socket.socket, text: str) -> bytes:
    """Send one keep-alive JSON request on ``s`` and read its whole answer (Content-Length body)."""
    body = b'{"inputs": {"text": "%s"}}' % text.encode()
    s.sendall(
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    s.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += s.recv(65536)
    return head


def test_the_header_deadline_is_each_requests_own_on_a_kept_alive_connection(
    serve: Callable[..., Server], slow_graph: Path
) -> None:
    """One header timer per connection (usg.serve.server): a reused connection idle past the header
    timeout still gets its next request answered, and a later request whose headers stall is cut off."""
    server = serve(slow_graph, "--header-timeout", "1", "--keepalive-timeout", "5")
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        assert _answer(s, "a").startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # past the header timeout since the connection opened and since its last request
        assert _answer(s, "b").startswith(b"HTTP/1.1 200")
        s.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-")  # then nothing
        assert _closed_by_server(s, within_s=6.0)
    finally:
        s.close()


@pytest.mark.slow
def test_clients_that_never_read_their_answers_are_reset_after_the_send_timeout(
    serve: Callable[..., Server], slow_graph: Path
) -> None:
    """Clients that pipeline requests for large answers and never read them: each connection is reset once it
    has left the server's writes unread for --send-timeout (before, it was held, with its buffers, for as long
    as the client kept it open), and the server answers everyone else meanwhile."""
    server = serve(slow_graph, "--send-timeout", "2")
    body = json.dumps({"inputs": {"text": "x" * 190_000}}).encode()  # each answer echoes 190 kB
    head = (
        f"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    readers = []
    for _ in range(4):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.settimeout(10)
        with contextlib.suppress(OSError):  # the server stops reading once its answers back up, then resets
            for _ in range(30):
                s.sendall(head.encode() + body)
        readers.append(s)
    try:
        assert httpx.post(f"{server.url}/v1/infer", json={"inputs": {"text": "hi"}}, timeout=10).status_code == 200
        deadline = time.monotonic() + 30
        while server.output().count("(--send-timeout); connection aborted") < len(readers):
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.2)
        for s in readers:
            got = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := s.recv(1 << 16):
                    got += len(chunk)
            assert got < 30 * 190_000  # reset: the answers it never read were not all kept for it
    finally:
        for s in readers:
            s.close()
