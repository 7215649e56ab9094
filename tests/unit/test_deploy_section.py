"""The graph's deploy: section and what the Ray engine makes of it (options, remote backends)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from usg.errors import BackendError, GraphError, UsageError
from usg.graph import DeployPolicy, GraphBuilder
from usg.graph.model import BatchPolicy, PadPolicy
from usg.runtime import Executor
from usg.runtime.kernel import BatchKernel, run_items
from usg.scale.ray_options import deployment_name, fn_options, model_options, router_options
from usg.specs import TensorSpec
from usg.testing import FakeBackend


def builder(deploy: Mapping[str, Any] | None = None) -> GraphBuilder:
    b = (
        GraphBuilder("g")
        .input("x", "tensor", spec=TensorSpec("float32", (1, None)))
        .model("m", "python", options={"callable": "testops:identity", "concurrency": 2}, batch=BatchPolicy(max_size=8))
        .node("split", fn="testops:split_rows", inputs={"x": "inputs.x"}, options={"parts": 3})
        .node("dbl", model="m", map=True, inputs={"x": "split.items"})
        .output("y", "dbl.y")
    )
    return b.deploy(deploy) if deploy is not None else b


def doubler() -> FakeBackend:
    return FakeBackend(
        lambda inp: {"y": inp["x"] * 2},
        input_specs={"x": TensorSpec("float32", ("batch", None))},
        output_specs={"y": TensorSpec("float32", ("batch", None))},
    )


def test_deploy_section_parses_into_policies() -> None:
    g = builder(
        {
            "router": {"num_replicas": 2, "num_cpus": 0.5},
            "models": {"m": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3, "num_gpus": 1}},
            "nodes": {"split": {"own_deployment": True}},
        }
    ).build()
    assert g.deploy.router == DeployPolicy(num_replicas=2, num_cpus=0.5)
    m = g.deploy.model("m")
    assert m.autoscaling and m.instances == 1 and m.num_gpus == 1.0
    assert g.deploy.own_nodes == ["split"]
    assert g.deploy.model("unlisted") == DeployPolicy()


def test_deploy_problems_are_all_reported_with_fixes() -> None:
    with pytest.raises(GraphError) as info:
        builder(
            {
                "routr": {},
                "models": {"mm": {"num_replicas": 2}, "m": {"num_replicas": 2, "min_replicas": 1, "num_cpus": -1}},
                "nodes": {"dbl": {"own_deployment": True}, "split": {"own_deployment": "yes", "max_replicas": 0}},
            }
        ).build()
    text = str(info.value)
    assert "deploy.routr" in text
    assert "'mm' is not a model" in text and "did you mean 'm'" in text
    assert "num_replicas is set together with min_replicas/max_replicas" in text
    assert "deploy.models.m.num_cpus" in text
    assert "'dbl' is not a Python (fn:) node" in text  # model nodes scale with their model
    assert "own_deployment is 'yes'" in text
    assert "deploy.nodes.split.max_replicas" in text


def test_a_model_can_stay_in_the_router_but_then_has_no_replicas_of_its_own() -> None:
    g = builder({"models": {"m": {"own_deployment": False}}}).build()
    assert g.deploy.router_models == ["m"] and g.deploy.own_nodes == []
    with pytest.raises(GraphError, match="num_replicas set, but own_deployment is false"):
        builder({"models": {"m": {"own_deployment": False, "num_replicas": 2}}}).build()


def test_min_above_max_and_target_without_autoscaling_are_refused() -> None:
    with pytest.raises(GraphError, match="min_replicas 3 > max_replicas 2"):
        builder({"models": {"m": {"min_replicas": 3, "max_replicas": 2}}}).build()
    with pytest.raises(GraphError, match="target_ongoing_requests only applies when autoscaling"):
        builder({"models": {"m": {"num_replicas": 2, "target_ongoing_requests": 4}}}).build()


def test_ray_options_come_from_deploy_batch_and_concurrency() -> None:
    g = builder(
        {
            "router": {"num_cpus": 1},
            "models": {"m": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 5, "num_gpus": 0.5}},
        }
    ).build()
    opts = model_options(g, "m")
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 5.0}
    assert "num_replicas" not in opts
    assert opts["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 0.5}
    assert opts["max_ongoing_requests"] == 2 * 8 * 2  # fills both concurrent batches of 8, twice over
    assert fn_options(g, "split")["num_replicas"] == 1
    router = router_options(g, max_inflight=64)
    assert router["num_replicas"] == 1 and router["ray_actor_options"] == {"num_cpus": 1.0}
    assert router["max_ongoing_requests"] > 64  # the router's own gate answers 429 first
    assert deployment_name("model", "a.b c") == "model-a_b_c" and deployment_name("router", "") == "router"


class RemoteDoubler(FakeBackend):
    """A remote backend: awaited on the event loop, never batched or thread-hopped locally."""

    remote = True

    def __init__(self) -> None:
        super().__init__(
            lambda inp: {"y": inp["x"] * 2},
            input_specs={"x": TensorSpec("float32", ("batch", None))},
            output_specs={"y": TensorSpec("float32", ("batch", None))},
        )
        self.loop_thread: set[int] = set()

    async def ainfer(self, inputs: Mapping[str, Any], timing: Any = None) -> dict[str, Any]:
        self.loop_thread.add(threading.get_ident())
        await asyncio.sleep(0)
        return self.infer(inputs)


def test_remote_backends_skip_the_local_batcher_and_fn_overrides_replace_node_functions() -> None:
    g = builder().build()
    remote = RemoteDoubler()
    seen: list[dict[str, Any]] = []

    def split_elsewhere(**kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs)
        x = kwargs["x"]
        return {"items": [x[:, i : i + 1] for i in range(x.shape[1])]}

    with Executor(g, backends={"m": remote}, fns={"split": split_elsewhere}) as ex:
        r = ex.infer_sync({"x": np.array([[1.0, 2.0]], np.float32)})
    assert [a.tolist() for a in r.outputs["y"]] == [[[2.0]], [[4.0]]]
    assert len(remote.calls) == 2  # one call per item: the remote deployment batches, not the router
    assert len(remote.loop_thread) == 1  # both on the event loop thread
    assert seen and set(seen[0]) == {"x", "parts"}  # the node's options are passed as to the real function


def test_run_items_groups_by_shape_pads_where_declared_and_isolates_a_poison_item() -> None:
    fake = FakeBackend(
        lambda inp: (_ for _ in ()).throw(ValueError("nan")) if np.isnan(inp["x"]).any() else {"y": inp["x"] + 1},
        input_specs={"x": TensorSpec("float32", ("batch", None))},
        output_specs={"y": TensorSpec("float32", ("batch", None))},
    )
    items = [{"x": np.zeros((1, n), np.float32)} for n in (2, 3, 2)] + [{"x": np.full((1, 2), np.nan, np.float32)}]
    out, calls = asyncio.run(run_items(BatchKernel("m", fake, None), items, queue_ms=[1.0, 2.0, 3.0, 4.0]))
    # the three (1,2) items with the nan one fail together, then each runs alone (at once); then (1,3)
    assert len(calls) == len(fake.calls) == 5
    # one event per backend call, as the in-process batcher reports them (failed calls too)
    assert calls[0].indices == (0, 2, 3) and (calls[0].event.items, calls[0].event.ok) == (3, False)
    assert sorted((c.indices, c.event.items, c.event.ok) for c in calls[1:4]) == [
        ((0,), 1, True),
        ((2,), 1, True),
        ((3,), 1, False),
    ]
    assert (calls[4].indices, calls[4].event.ok) == ((1,), True)
    assert calls[0].event.queue_ms == (1.0, 3.0, 4.0) and calls[0].event.real_elements == 6
    assert [o["y"].shape for o in out[:3] if isinstance(o, dict)] == [(1, 2), (1, 3), (1, 2)]
    assert isinstance(out[3], BackendError) and "nan" in str(out[3])
    assert sorted(c["x"].shape[0] for c in fake.calls)[-1] == 3  # the three (1,2) items shared a call first
    fake.calls.clear()
    pad = PadPolicy(axes={"x": (1,)}, multiple=4, trim={"y": {1: ("x", 1, 1)}})
    out, calls = asyncio.run(run_items(BatchKernel("m", fake, pad), items[:3]))
    assert len(calls) == len(fake.calls) == 1 and fake.calls[0]["x"].shape == (3, 4)
    assert (calls[0].event.real_elements, calls[0].event.padded_elements, calls[0].event.rows) == (7, 12, 3)
    assert [o["y"].shape for o in out if isinstance(o, dict)] == [(1, 2), (1, 3), (1, 2)]


def test_fn_overrides_must_name_python_nodes() -> None:
    with pytest.raises(UsageError, match=r"\['dbl', 'nope'\].*use \['split'\]"):
        Executor(builder().build(), fns={"dbl": print, "nope": print})


def test_deployment_plan_puts_router_models_and_plain_nodes_in_the_router() -> None:
    from usg.scale.ray_options import deployment_plan

    g = builder({"models": {"m": {"own_deployment": False}}, "nodes": {"split": {"own_deployment": True}}}).build()
    plan = {d.name: d for d in deployment_plan(g, max_inflight=10)}
    assert set(plan) == {"node-split", "router"}
    assert plan["router"].runs_in_router == ("model m",) and plan["router"].options["max_ongoing_requests"] == 26
    plan = {d.name: d for d in deployment_plan(builder().build())}
    assert set(plan) == {"model-m", "router"} and plan["router"].runs_in_router == ("node split",)


def test_a_stream_node_in_a_deployment_of_its_own_is_refused_with_the_fix() -> None:
    """Its per-session state (``session_state``) lives in the router's session; a model's state travels."""
    from usg.scale.ray_options import deployment_plan
    from usg.specs import AudioSpec

    b = (
        GraphBuilder("s")
        .input("audio", "audio", audio=AudioSpec(sample_rate=16000, channels=1, max_seconds=60))
        .node("windows", fn="usg.ops.vad_stream:vad_windows", inputs={"audio": "inputs.audio"})
        .node("split", fn="testops:split_rows", map=["x"], inputs={"x": "windows.frames"})
        .output("w", "windows.frames")
        .output("items", "split.items")
    )
    ok = {d.name for d in deployment_plan(b.deploy({"nodes": {"split": {"own_deployment": True}}}).build())}
    assert ok == {"node-split", "router"}
    with pytest.raises(GraphError) as info:
        deployment_plan(b.deploy({"nodes": {"windows": {"own_deployment": True}}}).build())
    [problem] = info.value.problems
    assert problem.where == "deploy.nodes.windows.own_deployment"
    assert "stream node (it takes session_state, ts_ms, flush)" in problem.message
    assert "remove deploy.nodes.windows.own_deployment" in problem.fix


def test_a_node_run_elsewhere_is_not_imported_in_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own deployment may hold dependencies the router's node lacks."""
    from usg.runtime import executor as executor_mod

    real = executor_mod.import_callable

    def guarded(ref: str) -> Any:
        assert ref != "testops:split_rows", "the router imported a node that runs in its own deployment"
        return real(ref)

    monkeypatch.setattr(executor_mod, "import_callable", guarded)
    seen: list[dict[str, Any]] = []

    def remote_split(**kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs)
        return {"items": [kwargs["x"]]}

    with Executor(builder().build(), backends={"m": doubler()}, fns={"split": remote_split}) as ex:
        ex.infer_sync({"x": np.array([[1.0, 2.0]], np.float32)})
    assert set(seen[0]) == {"x", "parts"}  # every option travels; the node's replica filters them


def test_a_node_replica_passes_only_the_options_its_function_accepts() -> None:
    pytest.importorskip("ray.serve")
    from usg.graph.model import NodeDef
    from usg.scale.ray_replicas import FnReplica

    g = builder().build()
    node = dataclasses.replace(g.nodes["split"], options={"parts": 2, "tuned_for": "gpu"})
    assert isinstance(node, NodeDef)
    replica = FnReplica(node)
    out = asyncio.run(replica({"x": np.ones((1, 2), np.float32), "parts": 2, "tuned_for": "gpu"}))
    assert len(out["items"]) == 2  # `tuned_for` (not a parameter of split_rows) was left out, not a TypeError


def test_a_node_module_that_raises_on_import_is_named_with_its_error(tmp_path: Any, monkeypatch: Any) -> None:
    from usg.backends.python_fn import import_callable

    (tmp_path / "cuda_ops.py").write_text("raise RuntimeError('CUDA driver version is insufficient')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"importing module 'cuda_ops' raised RuntimeError: CUDA driver version"):
        import_callable("cuda_ops:run")
