"""Triton's gRPC inference messages ↔ executor inputs and outputs.

The rules are the HTTP v2 endpoint's (:mod:`usg.serve.oip`): each request tensor is decoded by
the same codec (:func:`usg.serve.binary.decode_tensor`) and turned into a graph input by the
same function, and each output value becomes the same v2 tensor. Request tensors come either
all in ``raw_input_contents`` (one entry per input, in order: what ``tritonclient.grpc``
sends) or each in its typed ``contents`` field. Outputs always go back in
``raw_output_contents`` (Triton does the same). An encoded image sent as ``BYTES`` is raw
file bytes here (protobuf carries bytes, so there is no base64 form as in JSON).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from usg.errors import InputError
from usg.graph import Graph
from usg.runtime import InferResult
from usg.serve.binary import DATATYPES, decode_tensor, encode_bytes_elements, tensor_bytes
from usg.serve.oip import VERSION, graph_metadata, graph_value, to_v2_output

__all__ = ["build_response", "metadata_response", "parse_infer_request", "requested_outputs"]

# datatype -> the InferTensorContents field that carries it when typed (FP16 has none: raw only)
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _typed_contents(t: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """The raw bytes of a tensor sent in its typed ``contents`` field (checked against its shape)."""
    field = f"inputs.{t.name}"
    datatype = t.datatype
    attr = CONTENTS_FIELD.get(datatype)
    if attr is None:
        known = datatype in DATATYPES
        raise InputError(
            f"{field}: datatype {datatype!r} " + ("has no typed contents field" if known else "is not a v2 datatype"),
            field=t.name,
            fix="send it in raw_input_contents" if known else f"use one of BYTES, {', '.join(DATATYPES)}",
        )
    values = getattr(t.contents, attr)
    count = math.prod(t.shape) if all(d >= 0 for d in t.shape) else -1
    if count >= 0 and len(values) != count:
        raise InputError(
            f"{field}: shape {list(t.shape)} needs {count} elements but {len(values)} were sent in contents.{attr}",
            field=t.name,
            fix=f"make shape match the number of elements in contents.{attr}",
        )
    if datatype == "BYTES":
        return encode_bytes_elements(list(values))
    try:
        return np.fromiter(values, dtype=np.dtype(DATATYPES[datatype]).newbyteorder("<"), count=len(values)).tobytes()
    except (OverflowError, ValueError) as exc:
        raise InputError(
            f"{field}: contents.{attr} does not fit datatype {datatype} ({exc})",
            field=t.name,
            fix=f"send numbers representable as {datatype}",
        ) from None


def parse_infer_request(graph: Graph, request: pb.ModelInferRequest) -> dict[str, Any]:
    """A ``ModelInferRequest`` → executor inputs (names, datatypes, shapes and sizes checked)."""
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InputError(
            f"the request has {len(request.inputs)} inputs but {len(raw_contents)} raw_input_contents entries",
            field="raw_input_contents",
            fix="send one raw_input_contents entry per input, in the order of inputs (or none, with typed contents)",
        )
    values: dict[str, Any] = {}
    for i, t in enumerate(request.inputs):
        if raw_contents:
            if t.HasField("contents"):
                raise InputError(
                    f"inputs.{t.name}: has typed contents while the request also uses raw_input_contents",
                    field=t.name,
                    fix="send every input in raw_input_contents, or every input in its contents field",
                )
            data = raw_contents[i]
        else:
            data = _typed_contents(t)
        entry = {
            "name": t.name,
            "datatype": t.datatype,
            "shape": list(t.shape),
            "parameters": {"binary_data_size": len(data)},
        }
        tensor, _ = decode_tensor(entry, memoryview(data), 0)
        if tensor.name in values:
            raise InputError(
                f"input {tensor.name!r} is given more than once", field=tensor.name, fix="send each input once"
            )
        values[tensor.name] = graph_value(graph, tensor)
    return values


def requested_outputs(graph: Graph, request: pb.ModelInferRequest) -> list[str]:
    """The outputs to return: those requested (each must exist), else all of the graph's."""
    if not request.outputs:
        return list(graph.outputs)
    names: list[str] = []
    for out in request.outputs:
        if out.name not in graph.outputs:
            raise InputError(
                f"requested output {out.name!r} does not exist",
                field="outputs",
                fix=f"request some of: {', '.join(graph.outputs)}",
            )
        if "classification" in out.parameters:
            raise InputError(
                f"outputs.{out.name}: the classification extension is not supported",
                field="outputs",
                fix="request the output without class_count and rank it on the client",
            )
        names.append(out.name)
    return names


def build_response(
    graph: Graph, request_id: str, client_id: str, result: InferResult, names: Sequence[str]
) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` of a result: the requested outputs present (pruned ones left out),
    each in ``raw_output_contents``; ``parameters`` carry ``pruned_nodes`` and ``request_id``."""
    response = pb.ModelInferResponse(model_name=graph.name, model_version=VERSION, id=client_id or request_id)
    response.parameters["pruned_nodes"].string_param = ",".join(result.pruned_nodes)
    response.parameters["request_id"].string_param = request_id
    for name in names:
        if name not in result.outputs:
            continue
        datatype, shape, value = to_v2_output(result.outputs[name], name)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(tensor_bytes(datatype, value))
    return response


def metadata_response(graph: Graph) -> pb.ModelMetadataResponse:
    """``ModelMetadataResponse`` from the same metadata as ``GET /v2/models/{graph}``."""
    meta = graph_metadata(graph)
    response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
    for entry in meta["inputs"]:
        response.inputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
    for entry in meta["outputs"]:
        response.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
    return response
