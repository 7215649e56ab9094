"""Write a BERT sentence encoder to ONNX from its safetensors weights, with numpy and ``onnx.helper`` only.

No torch, no transformers: the graph is built operator by operator from ``config.json``
(BertModel: embeddings + LayerNorm, ``num_hidden_layers`` post-LN encoder blocks with
erf-GELU) and ends, like :mod:`usg.export.hf_text_encoder`'s torch export, with masked
mean pooling and L2 normalisation: ``input_ids``, ``attention_mask``, ``token_type_ids``
(int64 ``[batch, seq]``) in, ``embedding`` (float32 ``[batch, hidden]``, unit norm) out.
This is how ``pip install 'usg[ocr]'`` runs the example without the torch stack.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import UsageError

__all__ = ["build_bert_encoder", "read_safetensors"]

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a ``.safetensors`` file as float32 numpy arrays (int64 kept), by name."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        data = fh.read()
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise UsageError(
                f"{path}: tensor {name!r} has dtype {info['dtype']}; fix: save the weights as F32/F16/BF16"
            )
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.astype(np.float32) if arr.dtype != np.int64 else arr
    return out


class _Builder:
    def __init__(self, weights: dict[str, np.ndarray], prefix: str) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.weights, self.prefix = weights, prefix
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def w(self, name: str, transpose: bool = False) -> str:
        key = self.prefix + name
        if key not in self.weights:
            raise UsageError(f"the weights have no tensor {key!r}; fix: pass a BertModel checkpoint")
        arr = self.weights[key]
        return self.const(np.ascontiguousarray(arr.T if transpose else arr), key)

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        self._n += 1
        name = name or f"const_{self._n}"
        self.inits.append(self.numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        # named nodes: ONNX Runtime's quantizer excludes nodes by name (usg quantize's fallback)
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], name=f"{op_type}_{self._n}", **attrs))
        return out

    def linear(self, x: str, name: str) -> str:
        return self.op("Add", self.op("MatMul", x, self.w(f"{name}.weight", transpose=True)), self.w(f"{name}.bias"))

    def layer_norm(self, x: str, name: str, eps: float) -> str:
        return self.op("LayerNormalization", x, self.w(f"{name}.weight"), self.w(f"{name}.bias"), axis=-1, epsilon=eps)

    def gelu(self, x: str) -> str:  # the exact (erf) GELU of BERT's "gelu"
        erf = self.op("Erf", self.op("Div", x, self.const(np.array(math.sqrt(2.0), np.float32))))
        half = self.op("Mul", x, self.const(np.array(0.5, np.float32)))
        return self.op("Mul", half, self.op("Add", erf, self.const(np.array(1.0, np.float32))))


def _attention(b: _Builder, x: str, mask_bias: str, layer: str, heads: int, hidden: int) -> str:
    d = hidden // heads
    split = b.const(np.array([0, 0, heads, d], np.int64))
    q = b.op("Transpose", b.op("Reshape", b.linear(x, f"{layer}.attention.self.query"), split), perm=[0, 2, 1, 3])
    k = b.op("Transpose", b.op("Reshape", b.linear(x, f"{layer}.attention.self.key"), split), perm=[0, 2, 3, 1])
    v = b.op("Transpose", b.op("Reshape", b.linear(x, f"{layer}.attention.self.value"), split), perm=[0, 2, 1, 3])
    scores = b.op("Mul", b.op("MatMul", q, k), b.const(np.array(1.0 / math.sqrt(d), np.float32)))
    probs = b.op("Softmax", b.op("Add", scores, mask_bias), axis=-1)
    ctx = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    return b.op("Reshape", ctx, b.const(np.array([0, 0, hidden], np.int64)))


def build_bert_encoder(model_dir: Path, output: Path, *, opset: int = 17) -> Path:
    """Write the pooled, normalised encoder of the BERT checkpoint in ``model_dir`` to ``output``."""
    import onnx
    from onnx import TensorProto, helper

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "bert" or config.get("hidden_act", "gelu") != "gelu":
        raise UsageError(
            f"{model_dir}: model_type {config.get('model_type')!r} / hidden_act {config.get('hidden_act')!r}; "
            "the torch-free exporter writes BERT with gelu only; fix: pip install 'usg[torch]' to export it with torch"
        )
    weights_file = model_dir / "model.safetensors"
    if not weights_file.is_file():
        raise UsageError(f"{model_dir} has no model.safetensors; fix: pip install 'usg[torch]' to export with torch")
    weights = read_safetensors(weights_file)
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
    b = _Builder(weights, prefix)
    hidden, heads, eps = int(config["hidden_size"]), int(config["num_attention_heads"]), float(config["layer_norm_eps"])
    # embeddings: word + position (0 .. seq-1) + token type, then LayerNorm
    seq = b.op("Gather", b.op("Shape", "input_ids"), b.const(np.array(1, np.int64)), axis=0)
    positions = b.op("Range", b.const(np.array(0, np.int64)), seq, b.const(np.array(1, np.int64)))
    emb = b.op(
        "Add",
        b.op(
            "Add",
            b.op("Gather", b.w("embeddings.word_embeddings.weight"), "input_ids"),
            b.op("Gather", b.w("embeddings.position_embeddings.weight"), positions),
        ),
        b.op("Gather", b.w("embeddings.token_type_embeddings.weight"), "token_type_ids"),
    )
    x = b.layer_norm(emb, "embeddings.LayerNorm", eps)
    mask = b.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [b, s]
    keep = b.op("Unsqueeze", mask, b.const(np.array([1, 2], np.int64)))  # [b, 1, 1, s]
    minimum = b.const(np.array(np.finfo(np.float32).min, np.float32))
    mask_bias = b.op("Mul", b.op("Sub", b.const(np.array(1.0, np.float32)), keep), minimum)
    for i in range(int(config["num_hidden_layers"])):
        layer = f"encoder.layer.{i}"
        attn = b.linear(_attention(b, x, mask_bias, layer, heads, hidden), f"{layer}.attention.output.dense")
        x = b.layer_norm(b.op("Add", attn, x), f"{layer}.attention.output.LayerNorm", eps)
        inter = b.gelu(b.linear(x, f"{layer}.intermediate.dense"))
        x = b.layer_norm(b.op("Add", b.linear(inter, f"{layer}.output.dense"), x), f"{layer}.output.LayerNorm", eps)
    # masked mean pooling, then L2 normalisation (as sentence-transformers' all-MiniLM-L6-v2)
    m3 = b.op("Unsqueeze", mask, b.const(np.array([2], np.int64)))
    axis1 = b.const(np.array([1], np.int64))
    summed = b.op("ReduceSum", b.op("Mul", x, m3), axis1, keepdims=0)
    counts = b.op("Max", b.op("ReduceSum", m3, axis1, keepdims=0), b.const(np.array(1e-9, np.float32)))
    pooled = b.op("Div", summed, counts)
    norm = b.op("Max", b.op("ReduceL2", pooled, axes=[1], keepdims=1), b.const(np.array(1e-12, np.float32)))
    b.nodes.append(helper.make_node("Div", [pooled, norm], ["embedding"], name="l2_normalize"))
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in _INPUTS]
    out = [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])]
    graph = helper.make_graph(b.nodes, "bert_sentence_encoder", ints, out, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="usg")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(output))
    return output


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
