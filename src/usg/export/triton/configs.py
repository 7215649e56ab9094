"""Build Triton ``ModelConfig`` messages (Triton's own protobuf schema) for exported models.

Batching follows the model's :class:`~usg.graph.BatchPolicy` and its tensors:

- ``batch.max_size > 1``: ``max_batch_size`` = max_size and ``dynamic_batching`` with the
  policy's delay and preferred sizes; the tensors' first dim must be dynamic;
- otherwise, a dynamic first dim: ``max_batch_size: 1`` and no dynamic batching (USG calls such a
  model with a batch axis of one item, and Triton's batch dim is that axis);
- otherwise (a fixed first dim, or a scalar): ``max_batch_size: 0`` and full shapes.

Instances: ``deploy.models.NAME`` replicas when the graph's ``deploy:`` section lists the model,
else the model's ``options.concurrency`` (default 1); ``KIND_GPU`` when it asks for GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from usg.doctor.triton.config import model_config_pb2
from usg.errors import GraphError, GraphProblem
from usg.export.triton.tensors import ModelWires, TritonTensor, batchable, declare
from usg.graph import Graph, ModelDef
from usg.graph.deploy import DeployPolicy

__all__ = ["Batching", "batching_for", "config_text", "instances_for", "make_config", "model_tensors"]

# USG onnxruntime options -> Triton onnxruntime backend parameters
_ORT_PARAMETERS = {"intra_op_threads": "intra_op_thread_count", "inter_op_threads": "inter_op_thread_count"}


class Batching:
    """``max_batch_size`` and the dynamic batcher settings (None: no dynamic batching)."""

    def __init__(self, max_batch_size: int, delay_us: int | None = None, preferred: Sequence[int] = ()) -> None:
        self.max_batch_size = max_batch_size
        self.delay_us = delay_us
        self.preferred = tuple(preferred)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0


def batching_for(model: ModelDef, io: ModelWires) -> Batching:
    """The Triton batching of ``model`` (module docstring: the rule); GraphError if the policy cannot hold."""
    policy = model.batch
    if policy.enabled:
        if not batchable(io):
            fixed = {n: list(w.shape) for n, w in [*io[0].items(), *io[1].items()] if not w.shape or w.shape[0] != -1}
            raise GraphError(
                [
                    GraphProblem(
                        f"models.{model.name}.batch.max_size",
                        f"batch.max_size is {policy.max_size} but tensors {fixed} of {model.path} have no "
                        "dynamic first (batch) dim, so Triton cannot batch them",
                        "remove batch: from the model, or re-export it with a dynamic batch dim",
                    )
                ]
            )
        return Batching(policy.max_size, round(policy.max_delay_ms * 1000), policy.preferred_sizes)
    return Batching(1 if batchable(io) else 0)


def model_tensors(io: ModelWires, batched: bool) -> tuple[list[TritonTensor], list[TritonTensor]]:
    ins = [declare(n, w, batched=batched) for n, w in io[0].items()]
    outs = [declare(n, w, batched=batched) for n, w in io[1].items()]
    return ins, outs


def instances_for(policy: DeployPolicy | None, concurrency: Any = 1) -> tuple[int, bool]:
    """(instance count, on GPU) from a ``deploy:`` policy if there is one, else ``concurrency``."""
    if policy is not None:
        return policy.instances, policy.num_gpus > 0
    return max(1, int(concurrency or 1)), False


def model_instances(graph: Graph, model: ModelDef) -> tuple[int, bool]:
    return instances_for(graph.deploy.models.get(model.name), model.options.get("concurrency", 1))


def ort_parameters(model: ModelDef) -> dict[str, str]:
    """The Triton onnxruntime backend parameters that carry the model's USG thread options."""
    return {_ORT_PARAMETERS[k]: str(int(v)) for k, v in model.options.items() if k in _ORT_PARAMETERS and v}


def _tensor(entry: Any, t: TritonTensor, pb2: Any, *, is_input: bool) -> None:
    entry.name = t.name
    entry.data_type = pb2.DataType.Value(t.data_type)
    entry.dims.extend(t.dims)
    if t.reshape is not None:
        entry.reshape.SetInParent()
        entry.reshape.shape.extend(t.reshape)
    if is_input and t.optional:
        entry.optional = True


def make_config(
    name: str,
    *,
    platform: str = "",
    backend: str = "",
    batching: Batching | None = None,
    inputs: Sequence[TritonTensor] = (),
    outputs: Sequence[TritonTensor] = (),
    instances: tuple[int, bool] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Any:
    """A ``ModelConfig``; non-string parameter values are stored as JSON."""
    pb2 = model_config_pb2()
    c = pb2.ModelConfig()
    c.name = name
    if platform:
        c.platform = platform
    if backend:
        c.backend = backend
    b = batching or Batching(0)
    c.max_batch_size = b.max_batch_size
    for t in inputs:
        _tensor(c.input.add(), t, pb2, is_input=True)
    for t in outputs:
        _tensor(c.output.add(), t, pb2, is_input=False)
    if b.delay_us is not None:
        c.dynamic_batching.SetInParent()
        c.dynamic_batching.max_queue_delay_microseconds = b.delay_us
        c.dynamic_batching.preferred_batch_size.extend(b.preferred)
    if instances is not None:
        group = c.instance_group.add()
        group.count = instances[0]
        group.kind = pb2.ModelInstanceGroup.KIND_GPU if instances[1] else pb2.ModelInstanceGroup.KIND_CPU
    for key, value in (parameters or {}).items():
        c.parameters[key].string_value = value if isinstance(value, str) else json.dumps(value)
    return c


def config_text(config: Any) -> str:
    from google.protobuf import text_format

    return str(text_format.MessageToString(config))
