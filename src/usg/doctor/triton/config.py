"""Parse Triton ``config.pbtxt`` files with Triton's own protobuf schema.

The schema is ``tritonclient.grpc.model_config_pb2`` (the ``triton`` extra);
text parsing uses ``google.protobuf.text_format``, whose errors carry the line
and column. A :class:`TritonModel` is the subject every Triton check reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.errors import MissingDependency

__all__ = [
    "DTYPE_TO_ONNX",
    "TritonModel",
    "dtype_name",
    "load_triton_model",
    "model_config_pb2",
    "parse_config_text",
]

# Triton data type -> ONNX tensor element type name (as onnx.TensorProto.DataType.Name).
DTYPE_TO_ONNX = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FLOAT16",
    "TYPE_FP32": "FLOAT",
    "TYPE_FP64": "DOUBLE",
    "TYPE_STRING": "STRING",
    "TYPE_BF16": "BFLOAT16",
}


def model_config_pb2() -> Any:
    """Triton's ModelConfig protobuf module, imported lazily."""
    try:
        from tritonclient.grpc import model_config_pb2 as pb2
    except ModuleNotFoundError as exc:
        raise MissingDependency("tritonclient", "triton", "checking Triton config.pbtxt files") from exc
    return pb2


def dtype_name(value: int) -> str:
    return str(model_config_pb2().DataType.Name(value))


@dataclass(frozen=True)
class ParseProblem:
    message: str
    line: int | None
    column: int | None


def parse_config_text(text: str) -> tuple[Any, ParseProblem | None]:
    """Parse config.pbtxt text; return ``(ModelConfig, None)`` or ``(None, problem)``."""
    from google.protobuf import text_format

    pb2 = model_config_pb2()
    config = pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        msg = str(exc)
        msg = re.sub(r"^\d+:\d+ : ", "", msg)
        return None, ParseProblem(msg, line, column)
    return config, None


@dataclass
class TritonModel:
    """One Triton model directory: its parsed config and the version folders present."""

    dir: Path
    config_path: Path
    text: str = ""
    config: Any = None
    problem: ParseProblem | None = None
    versions: dict[int, list[str]] = field(default_factory=dict)  # version -> file names inside

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def loc(self) -> str:
        return str(self.config_path)

    @property
    def repo(self) -> Path:
        return self.dir.parent

    def line_of(self, *needles: str) -> int | None:
        """1-based line of the first regex in ``needles``, each later one searched after the previous."""
        if not self.text:
            return None
        lines = self.text.splitlines()
        start = 0
        found: int | None = None
        for needle in needles:
            rx = re.compile(needle)
            for i in range(start, len(lines)):
                if rx.search(lines[i]):
                    found, start = i + 1, i + 1
                    break
            else:
                return found
        return found

    def line_of_tensor(self, name: str) -> int | None:
        return self.line_of(rf'name\s*:\s*"{re.escape(name)}"')


def _versions(model_dir: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    try:
        entries = list(model_dir.iterdir())
    except OSError:
        return out
    for p in entries:
        if p.is_dir() and p.name.isascii() and p.name.isdigit():  # '²' is a digit to isdigit(), not to int()
            try:
                out[int(p.name)] = sorted(c.name for c in p.iterdir())
            except OSError:
                out[int(p.name)] = []
    return dict(sorted(out.items()))


def _load(path: Path) -> TritonModel:
    config_path = path if path.is_file() else path / "config.pbtxt"
    model = TritonModel(dir=config_path.parent, config_path=config_path)
    model.versions = _versions(model.dir)
    try:
        model.text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        model.problem = ParseProblem(f"cannot read the file: {exc}", None, None)
        return model
    model.config, model.problem = parse_config_text(model.text)
    return model


def load_triton_model(path: Path, ctx: Any = None) -> TritonModel:
    """Load a model directory (or a config.pbtxt path), cached in the run's context if given."""
    if ctx is None:
        return _load(path)
    key = ("triton_model", (path if path.is_file() else path / "config.pbtxt").resolve())
    return ctx.cached(key, lambda: _load(path))
