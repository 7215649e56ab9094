"""ONNX Runtime backend: one InferenceSession per model, shared by every node that calls it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from usg.backends.base import BackendState, DeclaredSpecsBackend
from usg.errors import BackendError, StateError
from usg.specs import Dim, TensorSpec

__all__ = ["OnnxRuntimeBackend", "describe_onnx"]

log = logging.getLogger("usg.backends.onnxruntime")

_PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")

_ELEM_TO_DTYPE = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "str",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}


@cache
def _describe_cached(path: str, mtime: float) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec], dict[str, str]]:
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def spec(vi: Any) -> TensorSpec:
        tt = vi.type.tensor_type
        shape: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            dims: list[Dim] = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
                elif d.HasField("dim_param") and d.dim_param not in ("", "?"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            shape = tuple(dims)
        return TensorSpec(dtype=_ELEM_TO_DTYPE.get(tt.elem_type), shape=shape)

    ins = {vi.name: spec(vi) for vi in model.graph.input if vi.name not in inits}
    outs = {vi.name: spec(vi) for vi in model.graph.output}
    meta = {p.key: p.value for p in model.metadata_props}
    return ins, outs, meta


def describe_onnx(path: Path) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec], dict[str, str]]:
    """Input specs, output specs and metadata of an ONNX file, read without building a session."""
    return _describe_cached(str(path), path.stat().st_mtime)


class OnnxRuntimeBackend(DeclaredSpecsBackend):
    """Runs an ONNX model with ONNX Runtime.

    Options: ``intra_op_threads`` (int), ``inter_op_threads`` (int), ``providers``
    (list; default: TensorRT, CUDA, CPU — whichever this onnxruntime build has),
    ``optimization`` (``all`` | ``extended`` | ``basic`` | ``disable``), ``spin`` (let intra-op
    threads busy-wait; default off, since pipeline models share the cores).
    """

    kind = "onnxruntime"

    def __init__(self, path: Path, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        try:
            ins, outs, meta = describe_onnx(Path(path))  # contracts from the file, without a session
        except Exception as exc:  # missing here (another node of a cluster), truncated, not ONNX
            raise BackendError(
                f"model {name or Path(path).stem!r}: cannot read {path} ({type(exc).__name__}: {exc}); "
                f"fix: check the file (`usg doctor {path}`); on a cluster every node must see it at this path"
            ) from exc
        super().__init__(ins, outs)
        self.path = Path(path)
        self.name = name or self.path.stem
        self.options = dict(options or {})
        self._session: Any = None
        self._meta = meta
        self.providers: list[str] = []

    @property
    def metadata(self) -> Mapping[str, str]:
        return self._meta

    @property
    def description(self) -> str:
        return f"onnxruntime {self.path.name} on {','.join(self.providers) or 'not loaded'}"

    def load(self) -> None:
        if self._session is not None:
            return
        import onnxruntime as ort

        so = ort.SessionOptions()
        threads = self.options.get("intra_op_threads")
        if threads:
            so.intra_op_num_threads = int(threads)
        inter = self.options.get("inter_op_threads")
        if inter:
            so.inter_op_num_threads = int(inter)
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        so.graph_optimization_level = levels[str(self.options.get("optimization", "all"))]
        so.log_severity_level = 3
        # ORT's intra-op threads busy-wait between ops by default: good for one model alone, but in a
        # pipeline several sessions share the cores and spinning threads steal them from each other
        if not self.options.get("spin", False):
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        available = ort.get_available_providers()
        wanted = self.options.get("providers") or list(_PREFERRED_PROVIDERS)
        providers = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
        try:
            self._session = ort.InferenceSession(str(self.path), sess_options=so, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise BackendError(
                f"model {self.name!r}: ONNX Runtime cannot load {self.path}: {exc}; "
                f"fix: run `usg doctor {self.path}` to see which op or opset is the problem"
            ) from exc
        self.providers = list(self._session.get_providers())
        # one intra-op thread on the CPU provider: ORT runs every op in the calling thread
        self.cpu_in_caller = self.providers == ["CPUExecutionProvider"] and threads is not None and int(threads) == 1
        log.info(
            "model %s: %s on %s (intra-op threads %s)",
            self.name,
            self.path.name,
            ", ".join(self.providers),
            threads or "default",
        )
        self.state = BackendState.LOADED

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if self._session is None:
            raise StateError(f"model {self.name!r} is {self.state.value}; call load() before infer()")
        feed = {k: np.ascontiguousarray(v) for k, v in inputs.items() if k in self._in}
        try:
            results = self._session.run(None, feed)
        except Exception as exc:
            shapes = {k: f"{v.dtype}{list(v.shape)}" for k, v in feed.items()}
            raise BackendError(f"model {self.name!r} failed on inputs {shapes}: {exc}") from exc
        return dict(zip(self._out, results, strict=True))

    def close(self) -> None:
        self._session = None
        self.state = BackendState.CLOSED
