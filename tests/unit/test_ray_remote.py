"""The router's retry of a failed replica call (no Ray cluster: a handle stand-in that fails)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")

from usg.errors import BackendError, ReplicaUnavailable
from usg.records import BatchEvent
from usg.runtime import Executor
from usg.scale import ray_remote
from usg.scale.ray_remote import RayFn, RayModelBackend
from usg.scale.reply import ReplicaReply


def one_model_graph(callable_: str, *, output: str, batch: Any = None) -> Any:
    """inputs.x → model m (a python backend) → outputs.y = the model's ``output`` port."""
    from usg.graph import GraphBuilder
    from usg.specs import TensorSpec

    return (
        GraphBuilder("g")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("m", "python", options={"callable": callable_}, batch=batch)
        .node("n", model="m", inputs={"x": "inputs.x"})
        .output("y", f"n.{output}")
        .build()
    )


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
    backend = RayModelBackend("det", FlakyHandle(2, ReplicaReply({"out": 1})))
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
    handle = FlakyHandle(0, ReplicaReply(BackendError("model 'rec' raised ValueError: bad")))
    with pytest.raises(BackendError, match="bad"):
        asyncio.run(RayModelBackend("rec", handle).ainfer({"x": 0}))
    assert handle.calls == 1


class SlowSpecsHandle:
    """A model deployment whose ``specs`` answers after ``polls`` timed-out waits (replicas loading)."""

    app_name, deployment_name = "g", "model-m"

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.waits: list[float | None] = []
        self.specs = self

    def remote(self) -> Any:
        handle = self

        class Response:
            def result(self, timeout_s: float | None = None) -> Any:
                handle.waits.append(timeout_s)
                if len(handle.waits) <= handle.polls:
                    raise TimeoutError("Timed out resolving to ObjectRef.")
                return ({}, {})

        return Response()


def test_the_router_waits_for_a_slow_model_to_load_and_gives_up_on_a_failed_one() -> None:
    """A model whose replicas still load is waited for; one Serve gave up on (or an application being
    deleted) ends the wait with the reason, instead of holding the router's start until Serve kills it."""
    slow = SlowSpecsHandle(polls=3)
    backend = RayModelBackend("m", slow)
    backend.start_failure = lambda: None  # type: ignore[method-assign]
    backend.load()
    assert len(slow.waits) == 4 and all(w is not None and w > 0 for w in slow.waits)

    failed = SlowSpecsHandle(polls=10**6)
    backend = RayModelBackend("m", failed)
    reasons = iter([None, None, "model-m failed to start: BackendError: cannot read m.onnx"])
    backend.start_failure = lambda: next(reasons)  # type: ignore[method-assign]
    with pytest.raises(BackendError) as info:
        backend.load()
    assert len(failed.waits) == 3
    assert str(info.value).startswith(
        "model 'm': the router cannot read its contracts: model-m failed to start: BackendError: cannot read m.onnx"
    )
    assert "fix:" in str(info.value)


class BatchingReplicaHandle:
    """Answers like a model replica whose @serve.batch put every two items in one backend call:
    the first item of each call carries that call's BatchEvent."""

    def __init__(self) -> None:
        self.n = 0

    def remote(self, item: dict[str, Any]) -> Any:
        self.n += 1
        batches = (BatchEvent("m", 2, 2, 4, 4, (3.0, 5.0), 7.0, True),) if self.n % 2 == 1 else ()
        reply = ReplicaReply({"y": item["x"] * 2}, batches)

        async def get() -> ReplicaReply:
            return reply

        return get()


def test_replica_batches_reach_the_router_metrics_as_in_process_batches() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from usg.graph import GraphBuilder
    from usg.graph.model import BatchPolicy
    from usg.serve.metrics import ServeMetrics
    from usg.specs import TensorSpec

    g = (
        GraphBuilder("g")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("m", "python", options={"callable": "testops:identity"}, batch=BatchPolicy(max_size=8))
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 4})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .output("y", "dbl.y")
        .build()
    )
    backend = RayModelBackend("m", BatchingReplicaHandle(), batching=True)
    backend._in = {"x": TensorSpec("float32", ("batch", None))}  # what load() would ask the replica
    backend._out = {"y": TensorSpec("float32", ("batch", None))}
    backend.load = lambda: None  # type: ignore[method-assign]
    metrics = ServeMetrics()
    with Executor(g, backends={"m": backend}, observers=[metrics]) as ex:
        metrics.bind_runners(ex.runners)
        out = ex.infer_sync({"x": np.arange(8, dtype=np.float32).reshape(1, 8)})
    assert len(out.outputs["y"]) == 4
    samples = {
        (s.name, s.labels.get("model")): s.value
        for fam in text_string_to_metric_families(metrics.render().decode())
        for s in fam.samples
    }
    assert samples[("usg_batch_size_count", "m")] == 2 and samples[("usg_batch_size_sum", "m")] == 4
    # queue wait and compute are the replica's, per batch — not the router's round trip per item
    assert samples[("usg_model_compute_seconds_count", "m")] == 2
    assert samples[("usg_model_compute_seconds_sum", "m")] == pytest.approx(0.014)
    assert samples[("usg_model_queue_wait_seconds_count", "m")] == 4
    assert samples[("usg_model_items_total", "m")] == 4


class ReplicaStandIn:
    """A model deployment's handle, answering in-process: specs() and one call per item."""

    def __init__(self, fn: Any, ins: dict[str, Any], outs: dict[str, Any]) -> None:
        self.fn, self.ins, self.outs = fn, ins, outs
        outer = self

        class Specs:
            def remote(self) -> Any:
                class Done:
                    def result(self, timeout_s: float | None = None) -> Any:
                        return outer.ins, outer.outs

                return Done()

        self.specs = Specs()

    def remote(self, item: dict[str, Any]) -> Any:
        async def get() -> ReplicaReply:
            return ReplicaReply(self.fn(item))

        return get()


def test_the_ray_router_exports_spans_with_otel() -> None:
    """The router built with otel="console" serves the HTTP API and makes request and node spans."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from starlette.testclient import TestClient

    from usg.scale.ray_router import Router
    from usg.serve.app import ServeConfig
    from usg.specs import TensorSpec

    spec = {"x": TensorSpec("float32", ("batch", None))}
    g = one_model_graph("testops:identity", output="x")
    handle = ReplicaStandIn(lambda item: {"x": item["x"] * 2}, spec, spec)
    router = Router(g, {"m": handle}, {}, ServeConfig(max_inflight=4), 30.0, "console")
    app = router.__serve_build_asgi_app__()
    spans = InMemorySpanExporter()
    app.state.usg.tracing.provider.add_span_processor(SimpleSpanProcessor(spans))  # beside the console one
    with TestClient(app) as client:
        r = client.post("/v1/infer", json={"inputs": {"x": [[1.0, 2.0]]}})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"]["y"] == [[2.0, 4.0]]
    by_name = {span.name: span for span in spans.get_finished_spans()}
    assert {"usg.request", "node n", "queue", "compute"} <= set(by_name)
    assert by_name["node n"].attributes["usg.model"] == "m"
    assert by_name["node n"].parent.span_id == by_name["usg.request"].context.span_id


def test_otel_variables_reach_the_router_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.scale.ray_app import _with_env, deployment_env

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    env = deployment_env("router", otel=True)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in deployment_env("model", otel=True)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in deployment_env("router", otel=False)
    # every deployment accepts gRPC replies past Ray's 4 MiB default (a 1440x736 det map is 4.2 MB)
    assert int(deployment_env("model")["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"]) >= 64 * 2**20
    actor = _with_env({"num_cpus": 0, "runtime_env": {"env_vars": {"A": "1"}}}, {"B": "2", "A": "0"})
    assert actor == {"num_cpus": 0, "runtime_env": {"env_vars": {"B": "2", "A": "1"}}}


def test_a_model_replica_runs_a_gathered_batch_and_reports_it_once() -> None:
    """What a model replica does with the items @serve.batch gathered (outside a cluster: the batch
    is handed over directly): one BatchEvent rides back with the first item, and every reply
    carries the compute and size of the call that ran it."""
    from usg.graph.model import BatchPolicy
    from usg.scale.ray_replicas import ModelReplica

    g = one_model_graph("testops:doubled", output="y", batch=BatchPolicy(max_size=8, max_delay_ms=50))
    replica = ModelReplica(g.models["m"])

    import time

    gathered = [({"x": np.full((1, 2), i, np.float32)}, time.perf_counter()) for i in range(3)]
    replies = asyncio.run(replica._run_batch(gathered))
    assert [r.outputs["y"].tolist() for r in replies] == [[[0.0, 0.0]], [[2.0, 2.0]], [[4.0, 4.0]]]  # type: ignore[index]
    assert [len(r.batches) for r in replies] == [1, 0, 0]
    (event,) = replies[0].batches
    assert (event.model, event.items, event.ok) == ("m", 3, True) and len(event.queue_ms) == 3
    assert {r.batch_size for r in replies} == {3} and {r.compute_ms for r in replies} == {event.compute_ms}
    assert replica.stats() == {"items": 3, "calls": 1}


def test_a_model_replica_batches_at_its_controllers_cap() -> None:
    """@serve.batch's cap and wait follow the replica's batch controller (its decisions are
    tested in test_controller.py); with ``adaptive: false`` the declared values hold."""
    import time

    from usg.graph.model import BatchPolicy
    from usg.scale.ray_replicas import ModelReplica

    policy = BatchPolicy(max_size=8, max_delay_ms=50, adaptive=True)
    replica = ModelReplica(one_model_graph("testops:doubled", output="y", batch=policy).models["m"])
    assert replica.controller is not None and replica._batched._get_max_batch_size() == 8
    replica.controller._i = 0  # as after a decision for cap 1
    gathered = [({"x": np.full((1, 2), i, np.float32)}, time.perf_counter()) for i in range(2)]
    asyncio.run(replica._run_batch(gathered))
    assert replica._batched._get_max_batch_size() == 1 and replica._batched._get_batch_wait_timeout_s() == 0.0
    fixed = dataclasses.replace(policy, adaptive=False)
    assert ModelReplica(one_model_graph("testops:doubled", output="y", batch=fixed).models["m"]).controller is None


def test_the_router_separates_the_hop_from_the_replicas_compute() -> None:
    """A remote model's node event: compute is the replica's, the rest of the round trip is waiting."""
    from usg.records import NodeEvent
    from usg.runtime.observer import Observer
    from usg.specs import TensorSpec

    class Hop(ReplicaStandIn):
        def remote(self, item: dict[str, Any]) -> Any:
            async def get() -> ReplicaReply:
                await asyncio.sleep(0.05)  # the hop and the replica's queue
                return ReplicaReply({"x": item["x"]}, compute_ms=4.0, batch_size=2)

            return get()

    class Events(Observer):
        def __init__(self) -> None:
            self.nodes: list[NodeEvent] = []

        def node_finished(self, event: NodeEvent) -> None:
            self.nodes.append(event)

    spec = {"x": TensorSpec("float32", ("batch", None))}
    g = one_model_graph("testops:identity", output="x")
    backend = RayModelBackend("m", Hop(lambda item: item, spec, spec))
    events = Events()
    with Executor(g, backends={"m": backend}, observers=[events]) as ex:
        ex.infer_sync({"x": np.ones((1, 2), np.float32)})
    (node,) = events.nodes
    assert node.compute_ms == 4.0 and node.queue_ms >= 40.0, node


def test_a_derived_array_travels_as_its_source_and_arrives_equal() -> None:
    import pickle

    from usg.ops.ocr import _det_input
    from usg.ops.wire import derived
    from usg.scale.transport import payload_bytes

    image = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    x = derived(_det_input, image, 32)
    np.testing.assert_array_equal(x, _det_input(image, 32))  # in this process: the array itself
    wire = pickle.dumps(x, protocol=5)
    assert len(wire) < image.nbytes + 1024 < x.nbytes  # it pickles as the uint8 image
    back = pickle.loads(wire)
    assert type(back) is np.ndarray and back.dtype == np.float32
    np.testing.assert_array_equal(back, x)
    assert payload_bytes({"x": x}) == image.nbytes + 8  # the image and det's limit_side_len
    assert len(pickle.dumps(x[:, :1], protocol=5)) > x[:, :1].nbytes  # a view is a plain array again


def test_a_private_ray_gets_its_quiet_settings_and_gives_them_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """connect_ray's settings for a private Ray go into the environment its processes inherit;
    a value the user set is kept, and shutdown_ray removes only what it put there."""
    from usg.scale import ray_app

    keys = list(ray_app.PRIVATE_RAY_ENV)
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(keys[0], "0.1")  # the user's own choice
    ray_app._private_env()
    assert os.environ[keys[0]] == "0.1"
    for key in keys[1:]:
        assert os.environ[key] == ray_app.PRIVATE_RAY_ENV[key]
    ray_app.shutdown_ray()  # Ray is not running here: only the environment is restored
    assert os.environ[keys[0]] == "0.1"
    assert not [key for key in keys[1:] if key in os.environ]
    assert float(ray_app.PRIVATE_RAY_ENV["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) <= 1.0  # failures still seen in 1 s


def test_no_deployment_writes_an_access_log_line_per_call() -> None:
    """Every USG deployment (models, nodes, the router) runs without Serve's access log: the proxy
    logs each HTTP request, and the router's /metrics counts the hops."""
    from usg.graph.deploy import DeployPolicy, DeploySpec
    from usg.scale.ray_app import build_ray_app
    from usg.serve.app import ServeConfig

    g = one_model_graph("testops:doubled", output="y")
    g = dataclasses.replace(g, deploy=DeploySpec(models={"m": DeployPolicy(num_replicas=2)}))
    app = build_ray_app(g, ServeConfig())
    router = app._bound_deployment
    model = router.init_args[1]["m"]._bound_deployment
    assert (router.name, model.name, model.num_replicas) == ("router", "model-m", 2)
    for d in (router, model):
        assert d._deployment_config.logging_config["enable_access_log"] is False, d.name
