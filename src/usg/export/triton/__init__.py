"""``usg export triton``: a Triton Inference Server model repository from a USG graph.

Written for a graph::

    OUT_DIR/
      det/config.pbtxt, det/1/model.onnx        one model per ONNX model (platform onnxruntime_onnx)
      tokenizer/config.pbtxt, 1/model.py, ...   other USG backends as Python-backend models
      GRAPH/config.pbtxt, GRAPH/1/...           the graph: an ensemble, or a BLS Python model

The graph is an ensemble when Triton can run it alone (no optional inputs, no fan-out, tensors
on every edge; :func:`plan_export` says why not), else a BLS Python model running the USG
executor with every model call sent to Triton. Configs are Triton's own protobuf
(``tritonclient.grpc.model_config_pb2``), written with ``google.protobuf.text_format``.
"""

from usg.export.triton.export import ONNX_VIA, ExportedModel, TritonExport, export_triton
from usg.export.triton.plan import BLS, ENSEMBLE, ExportPlan, plan_export

__all__ = ["BLS", "ENSEMBLE", "ONNX_VIA", "ExportPlan", "ExportedModel", "TritonExport", "export_triton", "plan_export"]
