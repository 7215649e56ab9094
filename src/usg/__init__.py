"""USG — Unified Serving Graph.

Declare a multimodal pipeline once as a typed graph, run it with per-model dynamic
batching and modality pruning, and check its contracts before deploy::

    import usg

    graph = usg.load_graph("examples/document_ocr/graph.yaml", export_missing=True)
    with usg.Executor(graph) as ex:
        result = ex.infer_sync({"image": "page.png", "text": "total due"})

Subpackages users name directly: ``usg.doctor`` (findings and checks), ``usg.plan``
(memory planner), ``usg.serve`` (HTTP app), ``usg.testing`` (FakeBackend).
"""

from usg import export as _export  # noqa: F401  (registers the model exporters with graph loading)
from usg.errors import (
    BackendError,
    ContractError,
    GraphError,
    InputError,
    MissingDependency,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    StateError,
    UsageError,
    USGError,
)
from usg.graph import BatchPolicy, Graph, GraphBuilder, PadPolicy, load_graph
from usg.ops.signature import ListOf, op
from usg.runtime import AlignBuffer, Executor, InferResult, Observer
from usg.specs import Modality, TensorSpec

__all__ = [
    "AlignBuffer",
    "BackendError",
    "BatchPolicy",
    "ContractError",
    "Executor",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "InferResult",
    "InputError",
    "ListOf",
    "MissingDependency",
    "Modality",
    "Observer",
    "Overloaded",
    "PadPolicy",
    "PayloadTooLarge",
    "RequestTimeout",
    "StateError",
    "TensorSpec",
    "USGError",
    "UsageError",
    "load_graph",
    "op",
]
__version__ = "0.1.0"
