"""Hostile HTTP against a real ``usg serve`` (the model-free ``slow`` graph): what a client can do
with the request's head before any route runs. Every refusal is an answer with a JSON body, the
connection is closed, and the server keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from harness import SERVE_RESOURCES, Server, start_server

from usg.serve.server import MAX_REQUEST_HEAD_BYTES


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(SERVE_RESOURCES / "slow.yaml", tmp=tmp_path_factory.mktemp("hostile-http"))
    yield s
    assert s.stop() == 0, s.output()


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _send_head_flood(server: Server, start: bytes, filler: bytes) -> bytes:
    """``start``, then ``filler`` until the server refuses (or 4x the head limit was sent), never
    ending the head; what the server answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(start)
        sent = len(start)
        try:
            while sent < 4 * MAX_REQUEST_HEAD_BYTES:
                sock.sendall(filler)
                sent += len(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending: the answer is already there
        try:
            return _answer(sock)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize(
    ("start", "filler"),
    [
        (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n", b"X-Pad: " + b"p" * 1000 + b"\r\n"),  # many headers
        (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"p" * 4096),  # one endless header
        (b"GET /v2/health/", b"a" * 4096),  # an endless URL
        (b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nCookie: ", b"c" * 4096),  # before auth, before the body
    ],
    ids=["many-headers", "one-header", "url", "cookie"],
)
def test_a_request_head_over_the_limit_is_431_before_it_ends(server: Server, start: bytes, filler: bytes) -> None:
    # before: the head was kept whole until it ended or --header-timeout passed (10 s); one client
    # sent 3 GB of headers in 4 s and the server's memory grew by 3.4 GB, never given back
    answer = _send_head_flood(server, start, filler)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"connection: close" in head.lower()
    payload = json.loads(body)
    assert payload["error"] == "header_too_large"
    assert str(MAX_REQUEST_HEAD_BYTES) in payload["message"] and payload["fix"]
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_heads_under_the_limit_and_pipelined_requests_are_served(server: Server) -> None:
    pad = b"X-Pad: " + b"p" * (MAX_REQUEST_HEAD_BYTES // 2) + b"\r\n"
    body = b'{"inputs": {"text": "hi"}}'
    request = (
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + pad
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    last = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + pad + b"\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request * 3 + last)  # together well over the limit, each head within it
        answer = _answer(sock)
    assert answer.count(b"HTTP/1.1 200 OK") == 4, answer[:600]
    assert answer.count(b'"echo":"hi"') == 3
