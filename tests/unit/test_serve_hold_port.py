"""usg serve's port: bound before the models load, kept until uvicorn listens on the same socket."""

from __future__ import annotations

import errno
import socket

import pytest

from usg.serve.server import PortInUse, hold_port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_held_port_stays_bound_and_is_the_socket_that_listens() -> None:
    port = _free_port()
    held = hold_port("127.0.0.1", port)
    try:
        assert held.getsockname() == ("127.0.0.1", port)
        # bound, not released: a plain bind of the same port (no SO_REUSEADDR) is refused
        other = socket.socket()
        with pytest.raises(OSError) as exc:
            other.bind(("127.0.0.1", port))
        other.close()
        assert exc.value.errno == errno.EADDRINUSE
        # the held socket is the one that listens (uvicorn gets it via run(sockets=[...]))
        held.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
            conn, _ = held.accept()
            client.sendall(b"ping")
            assert conn.recv(4) == b"ping"
            conn.close()
    finally:
        held.close()


def test_a_port_another_process_listens_on_is_refused_with_the_fix() -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUse) as exc:
            hold_port("127.0.0.1", port)
    message = str(exc.value)
    assert f"port {port}" in message and "already in use" in message and "--port" in message
