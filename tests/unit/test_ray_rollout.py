"""Will a graph's deployments fit the cluster, and waiting for Serve with its diagnosis (no Ray)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from usg.errors import GraphError, StateError
from usg.scale.ray_options import PlannedDeployment
from usg.scale.ray_rollout import deployment_failure, describe, unfit_deployments, wait_until_running


def planned(name: str, cpus: float = 0, gpus: float = 0, replicas: int = 1, auto: bool = False) -> PlannedDeployment:
    actor: dict[str, Any] = {"num_cpus": cpus}
    if gpus:
        actor["num_gpus"] = gpus
    opts: dict[str, Any] = {"ray_actor_options": actor}
    if auto:
        opts["autoscaling_config"] = {"min_replicas": replicas, "max_replicas": replicas + 4}
    else:
        opts["num_replicas"] = replicas
    return PlannedDeployment(name, "model", name, opts)


CPU_BOX = [{"CPU": 2.0, "memory": 1e9}]


def test_a_gpu_replica_fits_no_cpu_node() -> None:
    (u,) = unfit_deployments([planned("model-det", gpus=1), planned("router")], CPU_BOX)
    assert (u.deployment, u.need, u.why) == ("model-det", {"GPU": 1.0}, "no node has that (the largest has GPU 0)")


def test_replicas_that_fit_one_by_one_but_not_together_are_named() -> None:
    plan = [planned("model-det", cpus=1, replicas=2), planned("model-rec", cpus=1, replicas=1, auto=True)]
    unfit = unfit_deployments(plan, CPU_BOX)
    assert [u.deployment for u in unfit] == ["model-det", "model-rec"]
    assert "CPU 3 wanted, 2 in the cluster" in unfit[0].why
    two_nodes = [*CPU_BOX, {"CPU": 2.0}]
    assert unfit_deployments(plan, two_nodes) == []
    assert unfit_deployments([planned("model-det"), planned("router")], CPU_BOX) == []  # num_cpus 0: fits


def test_a_deploy_section_this_machine_cannot_fit_is_a_graph_error_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph file is what to change (docs/index.md: exit 2 is for a wrong command line)."""
    ray = pytest.importorskip("ray")
    from usg.cli import EXIT_FAILED, exit_code_for
    from usg.scale.ray_rollout import check_fits

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": CPU_BOX[0]}])
    minilm = dataclasses.replace(planned("model-minilm", gpus=1), target="minilm")
    plan = [minilm, PlannedDeployment("router", "router", "", {"ray_actor_options": {}})]
    with pytest.raises(GraphError, match=r"graph 'g\.yaml' is invalid: 1 problem") as info:
        check_fits(plan, private=True, warn=pytest.fail, source="g.yaml")
    (problem,) = info.value.problems
    assert problem.where == "deploy.models.minilm"
    assert "model-minilm needs {GPU: 1} per replica × 1: no node has that (the largest has GPU 0)" in problem.message
    assert "--ray-address" in problem.fix and exit_code_for(info.value) == EXIT_FAILED
    warned: list[str] = []
    check_fits(plan, private=False, warn=warned.append)  # a joined cluster may grow: a warning
    assert "model-minilm needs {GPU: 1}" in warned[0]


@dataclass
class Dep:
    status: str
    replica_states: dict[str, int] = field(default_factory=dict)
    message: str = ""


@dataclass
class App:
    status: str
    deployments: dict[str, Dep]
    message: str = ""


@dataclass
class Status:
    applications: dict[str, App]


TRACEBACK = """The deployment failed to start 3 times in a row. This may be due to a constructor failing.
Traceback (most recent call last):
  File "replica.py", line 10, in initialize
    raise RuntimeError(traceback.format_exc())
RuntimeError: Traceback (most recent call last):
  File "onnxruntime.py", line 3, in load
usg.errors.BackendError: model 'm': cannot load /models/m.onnx: No such file
"""


def test_a_failed_deploy_reports_each_replicas_own_error() -> None:
    app = App("DEPLOY_FAILED", {"model-m": Dep("DEPLOY_FAILED", message=TRACEBACK), "router": Dep("HEALTHY")})
    with pytest.raises(StateError) as info:
        wait_until_running("g", timeout_s=5, status=lambda: Status({"g": app}), poll_s=0.01)
    assert str(info.value).splitlines()[1] == (
        "model-m: DEPLOY_FAILED (no replicas yet): The deployment failed to start 3 times in a row: "
        "usg.errors.BackendError: model 'm': cannot load /models/m.onnx: No such file"
    )


def test_replicas_never_scheduled_end_in_a_timeout_with_serves_message() -> None:
    pending = "Deployment 'model-det' has 1 replicas that have taken more than 30s to be scheduled. " + (
        'Resources required for each replica: {"CPU": 0, "GPU": 1}, total resources available: {"CPU": 2}.'
    )
    app = App("DEPLOYING", {"model-det": Dep("UPDATING", {"PENDING_ALLOCATION": 1}, pending)})
    seen: list[str] = []
    with pytest.raises(StateError, match=r"did not bring 'g' up within 0.2 s \(DEPLOYING\)") as info:
        wait_until_running("g", timeout_s=0.2, status=lambda: Status({"g": app}), progress=seen.append, poll_s=0.01)
    assert "model-det: UPDATING (PENDING_ALLOCATION 1): Deployment 'model-det' has 1 replicas" in str(info.value)
    assert '"GPU": 1' in str(info.value) and seen and seen[0] == "waiting for model-det"


def test_running_returns_and_healthy_deployments_are_not_listed() -> None:
    calls = iter([Status({}), Status({"g": App("DEPLOYING", {"a": Dep("UPDATING")})})])
    final = Status({"g": App("RUNNING", {"a": Dep("HEALTHY")})})
    wait_until_running("g", timeout_s=5, status=lambda: next(calls, final), poll_s=0.01)
    assert describe(App("RUNNING", {"a": Dep("HEALTHY")})) == ""


def test_a_deployment_that_may_still_come_up_is_no_failure_and_one_serve_gave_up_on_is() -> None:
    loading = Status({"g": App("DEPLOYING", {"model-m": Dep("UPDATING", {"STARTING": 1}), "router": Dep("UPDATING")})})
    assert deployment_failure("g", "model-m", lambda: loading) is None
    failed = Status({"g": App("DEPLOY_FAILED", {"model-m": Dep("DEPLOY_FAILED", message=TRACEBACK)})})
    assert deployment_failure("g", "model-m", lambda: failed) == (
        "model-m failed to start: The deployment failed to start 3 times in a row: "
        "usg.errors.BackendError: model 'm': cannot load /models/m.onnx: No such file"
    )
    deleting = Status({"g": App("DELETING", {"model-m": Dep("UPDATING")})})
    assert deployment_failure("g", "model-m", lambda: deleting) == "its application 'g' is being deleted"
    assert deployment_failure("g", "model-m", lambda: Status({})) == "its application 'g' no longer exists"


def test_the_routers_requests_in_flight_are_read_off_its_metrics_and_waited_for() -> None:
    from usg.scale.ray_rollout import inflight_in_metrics, wait_until_idle

    text = "# HELP usg_inflight_requests HTTP inference requests being handled.\nusg_inflight_requests 4.0\n"
    assert inflight_in_metrics(text) == 4.0 and inflight_in_metrics("usg_batch_size_count 1.0\n") is None
    seen = iter([3.0, 1.0, 0.0, 5.0])
    slept: list[float] = []
    assert wait_until_idle(lambda: next(seen), timeout_s=60, sleep=slept.append) is True and len(slept) == 2
    assert wait_until_idle(lambda: None, timeout_s=60, sleep=pytest.fail) is True  # unreadable: no wait
    assert wait_until_idle(lambda: 1.0, timeout_s=0, sleep=pytest.fail) is False  # still busy at the deadline


def test_the_routers_metrics_are_read_directly_not_through_an_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from usg.scale.ray_rollout import router_inflight

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"usg_inflight_requests 3.0\n" if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a proxy that is not there
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        assert router_inflight(url) == 3.0
        server.shutdown()
        assert router_inflight(url, timeout_s=1) is None  # gone: no wait
    finally:
        server.server_close()
