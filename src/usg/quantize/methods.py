"""Thin calls into ONNX Runtime's quantization tooling — USG has no quantizer of its own.

- ``static``: :func:`onnxruntime.quantization.quantize_static`, QDQ format, per-channel weights,
  uint8 activations, int8 weights on CPUs with VNNI and uint8 weights without (AVX2's u8·s8
  instruction saturates int16 sums, which costs MiniLM 0.15 of cosine), calibrated by MinMax, Entropy
  or Percentile over the tensors the model really received in the graph
  (:class:`ItemsReader`).
- ``dynamic``: :func:`onnxruntime.quantization.quantize_dynamic` (per-channel 8-bit weights as
  above, activations quantized at run time; no calibration).
- ``int4``: MatMulNBits weight-only (``MatMulNBitsQuantizer``, 4 bits, block 32).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from usg.errors import MissingDependency, UsageError

__all__ = [
    "CALIBRATIONS",
    "METHODS",
    "ItemsReader",
    "QuantSettings",
    "has_vnni",
    "model_size_mb",
    "pad_to_common_shape",
    "quantize_model",
]

METHODS = ("static", "dynamic", "int4")
CALIBRATIONS = ("minmax", "entropy", "percentile")


@dataclass(frozen=True)
class QuantSettings:
    """How one model is quantized; ``exclude_nodes`` / ``exclude_op_types`` stay FP32."""

    method: str = "static"
    calibration: str = "minmax"
    per_channel: bool = True
    weights: str = "auto"  # int8 | uint8 | auto: int8 with VNNI, else uint8 (AVX2's u8·s8 saturates)
    exclude_nodes: tuple[str, ...] = ()
    exclude_op_types: tuple[str, ...] = ()
    # passed to ORT's calibrators, e.g. {"CalibPercentile": 99.99}; tests force harmful ones
    calibration_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"--method {self.method!r}: unknown; fix: use one of {', '.join(METHODS)}")
        if self.calibration not in CALIBRATIONS:
            raise UsageError(f"--calibration {self.calibration!r}: unknown; fix: use one of {', '.join(CALIBRATIONS)}")

    @property
    def weight_type(self) -> str:
        if self.weights != "auto":
            return self.weights
        return "int8" if has_vnni() else "uint8"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.method != "int4":
            out["weights"] = self.weight_type
        if self.method == "static":
            out["calibration"] = self.calibration
            out["per_channel"] = self.per_channel
        if self.exclude_nodes:
            out["exclude_nodes"] = list(self.exclude_nodes)
        if self.exclude_op_types:
            out["exclude_op_types"] = list(self.exclude_op_types)
        return out


class ItemsReader(CalibrationDataReader):
    """Feeds recorded model inputs (each with its batch axis of one) to ORT's calibrators."""

    def __init__(self, items: Sequence[Mapping[str, Any]], input_names: Sequence[str]) -> None:
        self._items = [{k: np.ascontiguousarray(v) for k, v in it.items() if k in input_names} for it in items]
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._items)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def pad_to_common_shape(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Items zero-padded to one shape per input. ORT's histogram calibrators (entropy, percentile)
    stack every item's activations into one array, so items of different lengths or sizes (token
    counts, crop widths, page sizes) make them fail; zero is the padding the graph's own
    pre-processing uses (attention mask 0, black crop margin) and MinMax needs none of this."""
    if not items:
        return []
    out: list[dict[str, Any]] = [dict(it) for it in items]
    for port in items[0]:
        arrays = [it[port] for it in items]
        if not all(isinstance(a, np.ndarray) for a in arrays) or len({a.shape for a in arrays}) == 1:
            continue
        if len({a.ndim for a in arrays}) != 1:
            continue
        shape = tuple(max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim))
        for it, a in zip(out, arrays, strict=True):
            padded = np.zeros(shape, dtype=a.dtype)
            padded[tuple(slice(0, n) for n in a.shape)] = a
            it[port] = padded
    return out


def has_vnni() -> bool:
    """Whether this x86 CPU has VNNI (int8 dot products without the AVX2 int16 saturation)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def model_size_mb(path: Path) -> float:
    """The file's size plus external data files next to it that it names, in MB."""
    total = path.stat().st_size
    data = path.with_name(path.name + ".data")
    if data.is_file():
        total += data.stat().st_size
    return total / 1e6


def _input_names(path: Path) -> list[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _quantizable_op_types(settings: QuantSettings, static: bool) -> list[str] | None:
    if not settings.exclude_op_types:
        return None
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry

    registry = QDQRegistry if static else IntegerOpsRegistry
    return sorted(set(registry) - set(settings.exclude_op_types))


def quantize_model(src: Path, dst: Path, settings: QuantSettings, items: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Quantize ``src`` into ``dst`` with ORT's tooling; ``items`` calibrate ``static``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    # ORT logs a "please pre-process" hint on every call through the root logger: quiet during the call only
    # (raised for good, it hid every warning of the process afterwards, the cache's and the server's included)
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        return _quantize(src, dst, settings, items)
    finally:
        root.setLevel(level)


def _quantize(src: Path, dst: Path, settings: QuantSettings, items: Sequence[Mapping[str, Any]]) -> Path:
    from onnxruntime import quantization as q

    exclude = list(settings.exclude_nodes) or None
    weight_type = q.QuantType.QInt8 if settings.weight_type == "int8" else q.QuantType.QUInt8
    if settings.method == "dynamic":
        folded = _constants_as_initializers(src, dst)
        try:
            q.quantize_dynamic(
                folded or src,
                dst,
                weight_type=weight_type,
                per_channel=settings.per_channel,
                nodes_to_exclude=exclude,
                op_types_to_quantize=_quantizable_op_types(settings, static=False),
            )
        finally:
            if folded is not None:
                folded.unlink(missing_ok=True)
    elif settings.method == "static":
        if not items:
            raise UsageError(
                f"static quantization of {src.name} needs calibration items, and the graph gave it none; "
                "fix: pass --inputs that reach this model, or use --method dynamic"
            )
        if settings.calibration != "minmax":
            items = pad_to_common_shape(items)
        method = {
            "minmax": q.CalibrationMethod.MinMax,
            "entropy": q.CalibrationMethod.Entropy,
            "percentile": q.CalibrationMethod.Percentile,
        }[settings.calibration]
        q.quantize_static(
            src,
            dst,
            ItemsReader(items, _input_names(src)),
            quant_format=q.QuantFormat.QDQ,
            per_channel=settings.per_channel,
            activation_type=q.QuantType.QUInt8,
            weight_type=weight_type,
            calibrate_method=method,
            nodes_to_exclude=exclude,
            op_types_to_quantize=_quantizable_op_types(settings, static=True),
            extra_options=dict(settings.calibration_options),
        )
    else:
        _quantize_int4(src, dst, settings)
    return dst


def _constants_as_initializers(src: Path, dst: Path) -> Path | None:
    """A copy of ``src`` (beside ``dst``) whose ``Constant`` tensors are initializers, or None if it has none.

    ORT's dynamic quantizer reads a Conv/MatMul weight only from an initializer and raises
    "Expected W to be an initializer" when the weight is a ``Constant`` node's output, as in the
    PP-OCR models exported by paddle2onnx (every Conv weight of ch_PP-OCRv4_det). The same values
    as initializers: the same model to every runtime.
    """
    import onnx

    model = onnx.load(str(src))
    constants = [
        n
        for n in model.graph.node
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"
    ]
    if not constants:
        return None
    for node in constants:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        model.graph.node.remove(node)
    out = dst.with_name(dst.stem + ".initializers.onnx")
    onnx.save(model, str(out))
    return out


def _quantize_int4(src: Path, dst: Path, settings: QuantSettings) -> None:
    import onnx

    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # the quantizer imports onnx_ir, which comes with onnxscript (usg[torch])
        raise MissingDependency(exc.name or "onnx_ir", "torch", "usg quantize --method int4") from None

    model = onnx.load(str(src))
    quant = MatMulNBitsQuantizer(
        model,
        bits=4,
        block_size=32,
        is_symmetric=True,
        nodes_to_exclude=list(settings.exclude_nodes),
    )
    quant.process()
    onnx.save_model(quant.model.model, str(dst))
