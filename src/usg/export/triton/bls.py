"""The BLS graph model: the USG executor inside Triton, calling the exported models through BLS.

:class:`GraphModel` loads the graph copied into its version folder (model paths rewritten to the
repository's files, so validation reads the same ONNX headers), and builds
``Executor(graph, backends={name: TritonBLSBackend(...)}, batching=False)``: pruning, fan-out
over lists and gathering are the executor's own code; every model call becomes a Triton BLS
request to that model, where Triton's dynamic batcher batches items across nodes and requests.

Parameters (config.pbtxt): ``usg_graph`` (file in the version folder), ``usg_models`` (JSON:
USG model → ``{"triton": NAME, "item_axis": [TENSOR, ...]}``), ``usg_timeout_s``.
Graph inputs: text ``TYPE_STRING [1]`` (UTF-8), image ``TYPE_STRING [1]`` (the encoded file,
decoded by USG with its pixel limit), tensors with their dtype and shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from usg.backends.base import Backend, DeclaredSpecsBackend
from usg.errors import BackendError
from usg.export.triton.python_models import TritonModelBase, pb_utils
from usg.export.triton.wire import add_item_axis, drop_item_axis, text_value, to_wire, triton_dtype
from usg.specs import Modality, TensorSpec

__all__ = ["GraphModel", "TritonBLSBackend"]

_BLS_THREADS = 32


class TritonBLSBackend(DeclaredSpecsBackend):
    """A model served by the same Triton server, called with a BLS request per item.

    Remote: the executor awaits :meth:`ainfer` without a local concurrency cap, so the items of a
    fan-out are in flight together and Triton's dynamic batcher can batch them.
    """

    kind = "triton-bls"
    remote = True

    def __init__(
        self,
        triton_model: str,
        input_specs: Mapping[str, TensorSpec],
        output_specs: Mapping[str, TensorSpec],
        *,
        item_axis: Sequence[str] = (),
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        super().__init__(input_specs, output_specs)
        self.triton_model = triton_model
        self.item_axis = tuple(item_axis)
        self._pool = pool

    @property
    def description(self) -> str:
        return f"Triton BLS -> {self.triton_model}"

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        pb = pb_utils()
        tensors = []
        for port, spec in self._in.items():
            if port in inputs:
                array = to_wire(inputs[port], triton_dtype(spec.dtype) or "TYPE_STRING")
                tensors.append(pb.Tensor(port, add_item_axis(array, self.item_axis, port)))
        request = pb.InferenceRequest(
            model_name=self.triton_model, requested_output_names=list(self._out), inputs=tensors
        )
        response = request.exec()
        if response.has_error():
            raise BackendError(f"Triton model {self.triton_model!r}: {response.error().message()}")
        out: dict[str, Any] = {}
        for name in self._out:
            tensor = pb.get_output_tensor_by_name(response, name)
            if tensor is None:
                raise BackendError(f"Triton model {self.triton_model!r} returned no output {name!r}")
            out[name] = drop_item_axis(tensor.as_numpy(), self.item_axis, name)
        return out

    async def ainfer(self, inputs: Mapping[str, Any], timing: Any = None) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.infer, inputs)


class GraphModel(TritonModelBase):
    """The whole graph as one Triton Python model (BLS); see the module docstring."""

    def initialize(self, args: Mapping[str, str]) -> None:
        super().initialize(args)
        from usg.graph import describe_model, load_graph
        from usg.runtime import Executor

        self.graph = load_graph(self.version_dir / self.params.get("usg_graph", "graph.yaml"))
        self.pool = ThreadPoolExecutor(max_workers=_BLS_THREADS, thread_name_prefix="usg-bls")
        backends: dict[str, Backend] = {}
        for name, info in self.json_param("usg_models", {}).items():
            io = describe_model(self.graph.models[name])
            if io is None:
                raise BackendError(f"graph model {name!r} declares no tensors; re-export the repository")
            backends[name] = TritonBLSBackend(
                info["triton"], io[0], io[1], item_axis=info.get("item_axis", ()), pool=self.pool
            )
        timeout = float(self.params.get("usg_timeout_s") or 60.0)
        self.executor = Executor(self.graph, backends=backends, batching=False, timeout_s=timeout)
        self.executor.start_sync()

    def graph_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        raw: dict[str, Any] = {}
        for name, array in inputs.items():
            d = self.graph.inputs[name]
            if d.modality is Modality.TEXT:
                raw[name] = text_value(array, name)
            elif d.modality is Modality.IMAGE and array.dtype.kind in "OSU":
                raw[name] = bytes(array.reshape(-1)[0]) if array.size == 1 else array
            else:
                raw[name] = array
        return raw

    def run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        return self.executor.infer_sync(self.graph_inputs(inputs)).outputs

    def run_all(self, inputs: list[dict[str, np.ndarray]]) -> list[Mapping[str, Any] | BaseException]:
        if len(inputs) < 2:
            return super().run_all(inputs)
        return list(self.pool.map(lambda one: super(GraphModel, self).run_all([one])[0], inputs))

    def finalize(self) -> None:
        self.executor.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
