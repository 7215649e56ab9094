"""``usg serve --engine ray`` on a joined cluster removes its application whenever a signal stops it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

serve = pytest.importorskip("ray.serve", reason="needs ray[serve] (usg[ray])")

from usg.cli.serve_ray import serve_on_ray  # noqa: E402

GRAPH = Path(__file__).resolve().parents[2] / "examples" / "document_ocr" / "graph.yaml"


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A joined cluster as the CLI sees it: connect, deploy and Serve's delete/status, recorded."""
    import usg.scale.ray_app as ray_app

    seen: dict[str, Any] = {"deleted": [], "shutdown": 0}
    monkeypatch.setattr(ray_app, "connect_ray", lambda address: None)
    monkeypatch.setattr(ray_app, "shutdown_ray", lambda: seen.__setitem__("shutdown", seen["shutdown"] + 1))
    monkeypatch.setattr(serve, "delete", lambda name: seen["deleted"].append(name))
    monkeypatch.setattr(serve, "status", lambda: pytest.fail("not reached: the signal stops the deploy first"))
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield seen
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGINT, previous[1])


def _run() -> None:
    serve_on_ray(str(GRAPH), "127.0.0.1", 8000, 64, 32.0, 60.0, "127.0.0.1:6379")


def test_a_signal_right_after_the_deploy_saw_the_app_running_still_deletes_it(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import usg.scale.ray_app as ray_app

    def deployed_then_signalled(graph: Any, *args: Any, **kwargs: Any) -> str:
        # the application is up (the proxy answers ready, a client sends SIGTERM) before the CLI notes it
        os.kill(os.getpid(), signal.SIGTERM)
        return "http://127.0.0.1:8000"

    monkeypatch.setattr(ray_app, "deploy_graph", deployed_then_signalled)
    _run()
    assert cluster["deleted"] == ["document-ocr"] and cluster["shutdown"] == 0  # joined: not our Ray to stop


def test_a_deploy_that_failed_on_its_own_is_not_deleted_again(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import usg.scale.ray_app as ray_app
    from usg.errors import StateError

    def failed(graph: Any, *args: Any, **kwargs: Any) -> str:
        raise StateError("model-det failed to start")

    monkeypatch.setattr(ray_app, "deploy_graph", failed)
    with pytest.raises(StateError):
        _run()
    assert cluster["deleted"] == []


def test_ctrl_c_while_ray_starts_is_not_lost_and_nothing_is_deployed(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init forks Ray's processes; a Ctrl-C due at a fork is handled inside Python's at-fork hooks
    (logging's), which print its KeyboardInterrupt as "Exception ignored" and go on. It used to be lost
    there: the graph was deployed and served anyway."""
    import usg.scale.ray_app as ray_app

    seen: dict[str, Any] = {"deployed": 0, "shutdown": 0}

    def ray_init_with_a_ctrl_c_at_a_fork(address: str | None) -> None:
        # the handler as Python runs it in an at-fork hook: an exception it raises is dropped
        with contextlib.suppress(KeyboardInterrupt):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # type: ignore[operator]

    def deploy(graph: Any, *args: Any, **kwargs: Any) -> str:
        seen["deployed"] += 1
        os.kill(os.getpid(), signal.SIGTERM)  # (so that the old code's serving loop ends)
        return "http://127.0.0.1:8000"

    monkeypatch.setattr(ray_app, "connect_ray", ray_init_with_a_ctrl_c_at_a_fork)
    monkeypatch.setattr(ray_app, "deploy_graph", deploy)
    monkeypatch.setattr(ray_app, "shutdown_ray", lambda: seen.__setitem__("shutdown", seen["shutdown"] + 1))
    monkeypatch.setattr(serve, "status", lambda: pytest.fail("not reached: nothing is deployed"))
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        serve_on_ray(str(GRAPH), "127.0.0.1", 8000, 64, 32.0, 60.0, None)  # a private local Ray
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert seen == {"deployed": 0, "shutdown": 1}  # stopped: nothing deployed, the private Ray shut down


def test_on_stop_the_router_finishes_its_requests_before_the_app_is_deleted(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting the app takes every model out of routing at once: requests the router was still running
    found no replica for their next model call and failed as a bare 500 after Serve's 20 s grace."""
    import usg.scale.ray_app as ray_app
    from usg.scale import ray_rollout

    events: list[Any] = []
    inflight = iter([2.0, 1.0, 0.0])

    def read(url: str) -> float | None:
        events.append(("inflight", url))
        return next(inflight)

    def status() -> Any:  # read once the app runs; a Ctrl-C then, with requests in flight
        os.kill(os.getpid(), signal.SIGTERM)
        return SimpleNamespace(applications={"document-ocr": SimpleNamespace(deployments={"router": None})})

    monkeypatch.setattr(ray_app, "deploy_graph", lambda graph, *a, **k: "http://0.0.0.0:8000")
    monkeypatch.setattr(ray_rollout, "router_inflight", read)
    monkeypatch.setattr(serve, "delete", lambda name: events.append(("delete", name)))
    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(ray_rollout.time, "sleep", lambda s: None)
    _run()
    assert events == [("inflight", "http://127.0.0.1:8000")] * 3 + [("delete", "document-ocr")]
