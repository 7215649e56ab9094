"""Joining a Ray cluster: addresses that cannot work are refused at once, naming where they came from;
a missing ``ray`` says the pip line (no Ray is started here)."""

from __future__ import annotations

import socket
import sys

import pytest

from usg.cli import EXIT_FAILED, EXIT_USAGE, exit_code_for
from usg.errors import MissingDependency, StateError, UsageError
from usg.scale import ray_app

pytest.importorskip("ray.serve", reason="needs ray[serve] (usg[ray])")


def test_a_dashboard_url_in_ray_address_is_refused_with_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """RAY_ADDRESS=http://127.0.0.1:8265 is what `ray job submit` wants, so it is often set; it used to
    fail as "Name or service not known" for a host 'http://127.0.0.1', with no word of $RAY_ADDRESS."""
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    with pytest.raises(UsageError, match=r"RAY_ADDRESS is 'http://127.0.0.1:8265'.*dashboard") as info:
        ray_app.connect_ray(None)
    message = str(info.value)
    assert "host:6379" in message and "ray://host:10001" in message and "unset RAY_ADDRESS" in message
    assert exit_code_for(info.value) == EXIT_USAGE
    with pytest.raises(UsageError, match=r"--ray-address is 'https://head:8265'") as info:
        ray_app.connect_ray("https://head:8265")
    assert "unset RAY_ADDRESS" not in str(info.value)


def test_an_unreachable_address_names_whether_it_came_from_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(StateError, match=rf"cannot reach the Ray cluster at '127.0.0.1:{port}' \(RAY_ADDRESS: "):
        ray_app.connect_ray(None)
    with pytest.raises(StateError, match=r"\(--ray-address: .*fix: start it"):
        ray_app.connect_ray(f"127.0.0.1:{port}")


def test_ray_not_installed_says_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is absent
    with pytest.raises(
        MissingDependency,
        match=r"usg serve --engine ray needs the Python package 'ray', which is not installed; "
        r"fix: pip install 'usg\[ray\]'",
    ) as info:
        ray_app.connect_ray(None)
    assert exit_code_for(info.value) == EXIT_FAILED


def test_serves_reconnect_notice_that_reads_as_if_the_port_were_ignored_is_dropped() -> None:
    import logging

    serve_log = logging.getLogger("ray.serve")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    serve_log.addHandler(handler)
    level = serve_log.level
    serve_log.setLevel(logging.INFO)
    try:
        ray_app.quiet_reconnect_notice()
        ray_app.quiet_reconnect_notice()  # installed once
        serve_log.info(
            'Connecting to existing Serve app in namespace "serve". New http_options/controller_options '
            "will not be applied."
        )
        serve_log.info('Started Serve in namespace "serve".')
    finally:
        serve_log.removeHandler(handler)
        serve_log.setLevel(level)
    assert seen == ['Started Serve in namespace "serve".']
    assert sum(type(f).__name__ == "_NoReconnectNotice" for f in serve_log.filters) == 1
