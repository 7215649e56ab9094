"""What graph building needs to know about model backends and exporters, without importing them.

``usg.graph`` sits below ``usg.backends`` and ``usg.export``: those packages register here
what validation and loading need — each backend kind (does it need a file; which input/output
specs does a model file declare, read without loading it) and the function that exports
missing model files. ``usg/__init__.py`` imports both, so a graph loaded through ``usg`` sees
every built-in kind. A kind nobody registered is reported as unknown, with the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from usg.specs import TensorSpec

__all__ = ["ModelIO", "ModelKind", "exporter", "model_kinds", "register_exporter", "register_model_kind"]

ModelIO = tuple[dict[str, TensorSpec], dict[str, TensorSpec]]
#: export every model whose file is missing and which declares an ``export:`` recipe
Exporter = Callable[[Iterable[Any], Callable[[str], None] | None], object]


@dataclass(frozen=True)
class ModelKind:
    """One backend kind as a graph file names it (``backend: onnxruntime``)."""

    name: str
    #: whether a model of this kind needs ``path:``
    needs_path: bool = False
    #: the specs a model file declares, read without loading it (None: it cannot say)
    describe: Callable[[Path | None], ModelIO | None] | None = None


_KINDS: dict[str, ModelKind] = {}
_EXPORTER: dict[str, Exporter] = {}


def register_model_kind(kind: ModelKind) -> None:
    _KINDS[kind.name] = kind


def model_kinds() -> Mapping[str, ModelKind]:
    return _KINDS


def register_exporter(func: Exporter) -> None:
    _EXPORTER["models"] = func


def exporter() -> Exporter | None:
    return _EXPORTER.get("models")
