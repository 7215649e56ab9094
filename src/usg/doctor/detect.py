"""Detect what kind of thing a path given to ``usg doctor`` is.

Kinds (the ``target`` names checks register for):

- ``onnx``          an ``.onnx`` file
- ``triton_model``  a Triton model directory (holds ``config.pbtxt``) or a ``config.pbtxt`` file
- ``graph``         a USG graph YAML file (top-level ``nodes`` or ``models`` mapping)
- ``hf_model``      a Hugging Face model directory (``config.json``, no ``config.pbtxt``)

A Triton repository (a directory of model directories) expands into one
``triton_model`` target per model; every model directory also yields one ``onnx``
target per ONNX file in its version folders, so the models get the ONNX checks too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from usg.errors import UsageError

__all__ = ["KINDS", "Target", "detect_targets"]

KINDS = ("onnx", "triton_model", "graph", "hf_model")

_YAML_SUFFIXES = (".yaml", ".yml")
_GRAPH_KEYS = ("nodes", "models")


@dataclass(frozen=True)
class Target:
    """One thing to check: its kind and path (a file or a directory)."""

    kind: str
    path: Path


def _is_graph_yaml(path: Path) -> bool:
    # Cheap sniff: a graph file has a top-level ``nodes:`` or ``models:`` key.
    try:
        with path.open("rb") as fh:  # the head only: a multi-GB .yaml is not read whole to sniff it
            head = fh.read(65536).decode("utf-8", errors="replace")
    except OSError:
        return False
    return any(line.startswith(f"{key}:") for line in head.splitlines() for key in _GRAPH_KEYS)


def _is_triton_model_dir(path: Path) -> bool:
    return (path / "config.pbtxt").is_file()


def _triton_model_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and _is_triton_model_dir(p))


def _expand_model_dir(path: Path) -> list[Target]:
    numbered = (p for p in path.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit())  # not '²'
    versions = sorted(numbered, key=lambda p: int(p.name))
    onnx_files = [f for v in versions for f in sorted(v.glob("*.onnx")) if f.is_file()]
    return [Target("triton_model", path)] + [Target("onnx", f) for f in onnx_files]


def detect_targets(path: Path) -> list[Target]:
    """Return the targets found at ``path``; raise :class:`UsageError` if it is missing or unknown."""
    if not path.exists():
        raise UsageError(f"path {str(path)!r} does not exist; fix: pass an existing file or directory")
    if path.is_file():
        name = path.name.lower()
        if name.endswith(".onnx"):
            return [Target("onnx", path)]
        if name == "config.pbtxt" or name.endswith(".pbtxt"):
            return [Target("triton_model", path.parent if name == "config.pbtxt" else path)]
        if name.endswith(_YAML_SUFFIXES) and _is_graph_yaml(path):
            return [Target("graph", path)]
        if name == "config.json":
            return [Target("hf_model", path.parent)]
        raise UsageError(
            f"cannot tell what {str(path)!r} is; fix: pass an .onnx file, a config.pbtxt, "
            "a Triton model directory or repository, a USG graph .yaml, or a Hugging Face model directory"
        )
    if not path.is_dir():
        raise UsageError(
            f"{str(path)!r} is neither a regular file nor a directory (a device, pipe or socket); "
            "fix: pass an .onnx file, a config.pbtxt, a Triton model directory or repository, a USG graph .yaml, "
            "or a Hugging Face model directory"
        )
    if _is_triton_model_dir(path):
        return _expand_model_dir(path)
    if (path / "config.json").is_file():
        return [Target("hf_model", path)]
    model_dirs = _triton_model_dirs(path)
    if model_dirs:
        return [t for d in model_dirs for t in _expand_model_dir(d)]
    onnx_files = sorted(path.glob("*.onnx"))
    if onnx_files:
        return [Target("onnx", p) for p in onnx_files]
    raise UsageError(
        f"directory {str(path)!r} holds no config.pbtxt, config.json, model sub-directories or .onnx files; "
        "fix: point at a Triton repository or model directory, an .onnx file or a graph .yaml"
    )
