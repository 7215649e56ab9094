"""Content addresses: SHA-256 digests of inputs, of node identities, and the node cache keys.

A node's key is a full 256-bit SHA-256 (never truncated) over

* USG's version and the node's identity: for a model node the model file's SHA-256 (computed
  once when the executor starts), its backend kind and options; for a Python node the
  function's qualified name and its package's version (or the module file's digest when it
  belongs to no installed distribution) and the node's options;
* for each input port, in port order: a graph input's digest as received plus its decode
  options (modality, declared spec, and the limits it is decoded under: pixels, aspect ratio,
  formats), or the upstream node's key and port.

An upstream key stands for the upstream value (a Merkle DAG over the graph): every node is a
deterministic function of its inputs, so equal keys mean equal values, and a hit needs no
upstream node to run. Graph inputs are hashed once, as received (the integrity digest).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import struct
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from usg.graph.model import Graph, InputDef, NodeDef
from usg.specs import Modality

__all__ = ["canonical_digest", "file_digest", "fn_identity", "input_digest", "node_keys", "usg_version"]

_CHUNK = 1 << 20


def usg_version() -> str:
    try:
        return importlib.metadata.version("usg")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def file_digest(path: Path) -> str:
    """SHA-256 of a file, or of every file under a directory (relative names and bytes)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Feed a value in a canonical, type-tagged form (dtype, shape, bytes for arrays)."""
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        if arr.dtype.hasobject:
            raise TypeError("object arrays have no canonical form")
        h.update(b"A" + arr.dtype.str.encode() + repr(arr.shape).encode() + b"\0")
        h.update(arr.data.cast("B") if arr.ndim else arr.tobytes())
    elif isinstance(value, np.generic):
        _feed(h, np.asarray(value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        h.update(b"B" + struct.pack("<Q", len(value)))
        h.update(value)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"S" + struct.pack("<Q", len(data)) + data)
    elif value is None or isinstance(value, bool):
        h.update(b"N" if value is None else (b"T" if value else b"F"))
    elif isinstance(value, int):
        h.update(b"I" + str(value).encode() + b"\0")
    elif isinstance(value, float):
        h.update(b"D" + struct.pack("<d", value))
    elif isinstance(value, (list, tuple)):
        h.update((b"L" if isinstance(value, list) else b"U") + struct.pack("<Q", len(value)))
        for v in value:
            _feed(h, v)
    elif isinstance(value, Mapping):
        h.update(b"M" + struct.pack("<Q", len(value)))
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif isinstance(value, Path):
        _feed(h, str(value))
    else:
        raise TypeError(f"a {type(value).__name__} has no canonical form")


def canonical_digest(value: Any) -> str:
    """SHA-256 of a value's canonical form (arrays: dtype, shape, bytes; containers recurse)."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def input_digest(d: InputDef, value: Any) -> str:
    """The integrity digest of a graph input as received: the bytes of an encoded image or audio
    file (a path is read), the UTF-8 of a text, the canonical form of an array."""
    if d.modality in (Modality.IMAGE, Modality.AUDIO) and isinstance(value, (str, Path)):
        return file_digest(Path(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return hashlib.sha256(value).hexdigest()
    if isinstance(value, str):
        return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return canonical_digest(value)


@cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def fn_identity(fn: str) -> str:
    """``module:function`` plus the version of the distribution that ships the module, or the
    digest of the module's file when no installed distribution does."""
    module = fn.partition(":")[0]
    top = module.partition(".")[0]
    dists = _distributions().get(top) or []
    if dists:
        try:
            return f"{fn}@{dists[0]}=={importlib.metadata.version(dists[0])}"
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    if origin and Path(origin).is_file():
        return f"{fn}@sha256:{file_digest(Path(origin))}"
    return f"{fn}@unknown"


def node_identity(graph: Graph, node: NodeDef, model_digests: Mapping[str, str]) -> str:
    """The node's own identity (no inputs): what it computes and with which file and options."""
    parts: dict[str, Any] = {"usg": usg_version(), "node": node.name, "map": list(node.map)}
    parts["options"] = node.options
    if node.model is not None:
        model = graph.models[node.model]
        parts["model"] = {
            "backend": model.backend,
            "file_sha256": model_digests.get(node.model, "none"),
            "options": model.options,
        }
    else:
        parts["fn"] = fn_identity(node.fn or "")
    return canonical_digest(json.dumps(parts, sort_keys=True, default=str))


def _decode_options(graph: Graph, name: str, d: InputDef) -> str:
    """Everything that decides what decoding an input yields, or whether it is refused: bytes
    that decoded once under these options decode again (so a hit may skip the decode)."""
    spec = d.spec.describe() if d.spec is not None else "-"
    limits = graph.limits
    if d.modality is Modality.IMAGE:
        formats = limits.image_formats
        if isinstance(formats, Mapping):
            formats = formats.get(name)
        limit = f"{limits.max_image_pixels}|{limits.max_aspect_ratio!r}|{','.join(formats or ('default',))}"
    else:
        limit = str(limits.max_text_chars)
    audio = f"|{d.audio.sample_rate}|{d.audio.channels}" if d.audio is not None else ""  # what decoding yields
    return f"{d.modality.value}|{spec}|{limit}{audio}"


def node_keys(
    graph: Graph, identities: Mapping[str, str], input_digests: Mapping[str, str], active: list[str]
) -> dict[str, str]:
    """Every active node's content address for one request (in graph order, so upstream first)."""
    keys: dict[str, str] = {}
    for name in active:
        node = graph.nodes[name]
        h = hashlib.sha256(b"usg-node-key/1\0" + identities[name].encode())
        for port in sorted(node.inputs):
            ref = node.inputs[port]
            if port in node.optional and (
                ref.port not in input_digests if ref.is_graph_input else ref.source not in keys
            ):
                src = "absent"
            elif ref.is_graph_input:
                d = graph.inputs[ref.port]
                src = f"in:{ref.port}:{input_digests[ref.port]}:{_decode_options(graph, ref.port, d)}"
            else:
                src = f"node:{keys[ref.source]}:{ref.port}"
            h.update(f"{port}={src}\0".encode())
        keys[name] = h.hexdigest()
    return keys
