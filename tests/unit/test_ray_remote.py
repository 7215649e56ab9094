"""The router's retry of a failed replica call (no Ray cluster: a handle stand-in that fails)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray")

from usg.errors import BackendError, ReplicaUnavailable
from usg.scale import ray_remote
from usg.scale.ray_remote import RayFn, RayModelBackend


class FlakyHandle:
    """Fails the first ``failures`` calls the way a dead replica does, then answers."""

    def __init__(self, failures: int, answer: Any) -> None:
        self.failures = failures
        self.answer = answer
        self.calls = 0

    def _next(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            import ray.exceptions

            raise ray.exceptions.ActorUnavailableError("replica gone", None)
        return self.answer

    def remote(self, *args: Any) -> Any:
        handle = self

        class Response:
            def result(self) -> Any:
                return handle._next()

            def __await__(self) -> Any:
                async def get() -> Any:
                    return handle._next()

                return get().__await__()

        return Response()


def test_a_dead_replica_is_retried_and_counted() -> None:
    counted: list[str] = []
    backend = RayModelBackend("det", FlakyHandle(2, {"out": 1}))
    backend.retry.on_retry = counted.append
    assert asyncio.run(backend.ainfer({"x": 0})) == {"out": 1}
    assert counted == ["model-det", "model-det"]
    fn = RayFn("lines", FlakyHandle(1, {"lines": []}))
    assert fn(probs=[]) == {"lines": []}


def test_retries_end_in_a_clear_503_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_remote, "_RETRY_WINDOW_S", 0.3)
    backend = RayModelBackend("rec", FlakyHandle(100, None))
    with pytest.raises(ReplicaUnavailable, match=r"model 'rec': its Ray Serve replicas failed \d+ call\(s\)") as info:
        asyncio.run(backend.ainfer({"x": 0}))
    assert info.value.status == 503 and info.value.reason == "replica_unavailable" and "fix:" in str(info.value)


def test_errors_of_the_call_itself_are_not_retried() -> None:
    handle = FlakyHandle(0, BackendError("model 'rec' raised ValueError: bad"))
    with pytest.raises(BackendError, match="bad"):
        asyncio.run(RayModelBackend("rec", handle).ainfer({"x": 0}))
    assert handle.calls == 1
