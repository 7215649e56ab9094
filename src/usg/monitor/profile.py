"""``usg profile``: push a folder of sample inputs through the graph and record a reference profile.

Files are grouped into requests by stem (``doc1.png`` + ``doc1.txt`` is one request with an image
and a text); ``STEM.INPUT.EXT`` names the input explicitly; a ``.jsonl`` file holds one request per
line (``{"text": "..."}``). Images (png, jpg, …) feed the graph's image input, ``.txt`` its text
input, ``.wav`` its audio input (samples as float32, rate recorded), ``.npy`` its tensor input.

The profile is deterministic (sorted files, seeded subsamples, no timestamps) and carries the
SHA-256 of the graph file and of every model file, so a drift report names the model version.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import wave
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import UsageError, USGError
from usg.graph.model import Graph
from usg.monitor.config import MonitorConfig, monitor_config
from usg.monitor.features import sniff_format
from usg.monitor.profile_check import check_profile
from usg.monitor.sketch import Observation, summarize
from usg.monitor.tap import Tap
from usg.runtime.observer import Observer
from usg.specs import Modality

__all__ = [
    "PROFILE_FORMAT",
    "ProfileRequest",
    "build_profile",
    "collect_requests",
    "graph_digests",
    "load_profile",
    "write_profile",
]

PROFILE_FORMAT = "usg.monitor.profile/1"
_EXT = {
    **dict.fromkeys((".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"), Modality.IMAGE),
    ".txt": Modality.TEXT,
    ".wav": Modality.AUDIO,
    ".npy": Modality.TENSOR,
}


@dataclass
class ProfileRequest:
    name: str
    raw: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def graph_digests(graph: Graph) -> dict[str, Any]:
    """SHA-256 of the graph file and of each model file (a folder: of its files in order)."""
    models: dict[str, Any] = {}
    for name, model in sorted(graph.models.items()):
        entry: dict[str, Any] = {"backend": model.backend}
        if model.path is not None and model.path.is_file():
            entry.update(path=str(model.path), sha256=_sha256(model.path))
        elif model.path is not None and model.path.is_dir():
            h = hashlib.sha256()
            for f in sorted(p for p in model.path.rglob("*") if p.is_file()):
                h.update(str(f.relative_to(model.path)).encode() + b"\0" + _sha256(f).encode())
            entry.update(path=str(model.path), sha256=h.hexdigest())
        elif model.options.get("callable"):
            entry["callable"] = str(model.options["callable"])
        models[name] = entry
    src = graph.source
    return {
        "name": graph.name,
        "path": None if src is None else str(src),
        "sha256": _sha256(src) if src is not None and src.is_file() else None,
        "models": models,
    }


def _read_wav(path: Path) -> tuple[np.ndarray[Any, Any], int]:
    with wave.open(str(path), "rb") as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(w.getnframes())
    if width not in (1, 2, 4):
        raise UsageError(f"{path}: {8 * width}-bit WAV is not supported; fix: convert it to 16-bit PCM")
    if width == 1:
        x = (np.frombuffer(frames, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    else:
        dtype = np.int16 if width == 2 else np.int32
        x = np.frombuffer(frames, dtype=dtype).astype(np.float32) / float(np.iinfo(dtype).max)
    return x.reshape(-1, channels).mean(axis=1), rate


def _input_for(graph: Graph, path: Path, explicit: str | None, modality: Modality) -> str:
    if explicit is not None and explicit in graph.inputs:
        return explicit
    names = [n for n, d in graph.inputs.items() if d.modality is modality]
    if len(names) == 1:
        return names[0]
    if not names:
        raise UsageError(
            f"{path}: graph {graph.name!r} has no {modality.value} input; fix: remove the file, or use an input "
            f"of {sorted(graph.inputs)}"
        )
    raise UsageError(
        f"{path}: graph {graph.name!r} has several {modality.value} inputs {names}; "
        f"fix: name the file STEM.INPUT{path.suffix} (e.g. {path.stem}.{names[0]}{path.suffix})"
    )


def _load_value(path: Path, modality: Modality) -> tuple[Any, dict[str, Any]]:
    if modality is Modality.IMAGE:
        data = path.read_bytes()
        return data, {"format": sniff_format(data)}
    if modality is Modality.TEXT:
        return path.read_text(encoding="utf-8").strip(), {}
    if modality is Modality.AUDIO:
        samples, rate = _read_wav(path)
        return samples, {"sample_rate": rate}
    from usg.npy import load_npy

    try:
        return load_npy(path), {}
    except ValueError as exc:  # a header declaring more than the file holds, an object array, not .npy at all
        raise UsageError(f"{path}: not a readable .npy array ({exc}); fix: save it with numpy.save") from None


def collect_requests(graph: Graph, folder: Path) -> list[ProfileRequest]:
    """The requests a folder of sample files makes (sorted, so the profile is reproducible)."""
    if not folder.is_dir():
        raise UsageError(f"--inputs {folder} is not a folder; fix: pass a folder of sample files")
    requests: dict[str, ProfileRequest] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        rel = path.relative_to(folder)
        if path.suffix.lower() == ".jsonl":
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{i}: not JSON ({exc}); fix: one JSON object per line") from None
                if not isinstance(doc, dict):
                    raise UsageError(f'{path}:{i}: expected an object like {{"text": "..."}}; fix: write one')
                requests[f"{rel}:{i}"] = ProfileRequest(f"{rel}:{i}", dict(doc))
            continue
        modality = _EXT.get(path.suffix.lower())
        if modality is None:
            continue
        stem, explicit = path.stem, None
        head, dot, tail = path.stem.rpartition(".")
        if dot and tail in graph.inputs:
            stem, explicit = head, tail
        key = str(rel.parent / stem)
        if explicit is None and stem in graph.inputs:  # x.npy, mask.npy (usg init's samples): one request per folder
            explicit, key = stem, str(rel.parent / "*")
        name = _input_for(graph, path, explicit, modality)
        req = requests.setdefault(key, ProfileRequest(key))
        if name in req.raw:
            raise UsageError(f"{path}: request {key!r} already has input {name!r}; fix: rename one of the files")
        req.raw[name], meta = _load_value(path, modality)
        if meta:
            req.meta[name] = meta
    if not requests:
        raise UsageError(
            f"{folder} holds no sample inputs; fix: add images (.png/.jpg), texts (.txt), .wav, .npy or .jsonl files"
        )
    return [requests[k] for k in sorted(requests)]


class _Collector(Observer):
    def __init__(self, tap: Tap) -> None:
        self.tap = tap
        self.meta: dict[str, dict[str, dict[str, Any]]] = {}
        self.observations: dict[str, Observation] = {}

    def request_values(
        self, request_id: str, inputs: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any] | None]
    ) -> None:
        picked = self.tap.pick_outputs(inputs, nodes)
        self.observations[request_id] = self.tap.observe(0.0, inputs, picked, self.meta.get(request_id))


async def _run_all(
    graph: Graph,
    collector: _Collector,
    requests: list[ProfileRequest],
    progress: Callable[[int, int], None] | None,
    errors: list[str],
) -> None:
    from usg.runtime import Executor

    sem = asyncio.Semaphore(4)
    done = 0
    async with Executor(graph, observers=[collector]) as ex:

        async def one(i: int, req: ProfileRequest) -> None:
            nonlocal done
            async with sem:
                rid = f"p{i:08d}"
                collector.meta[rid] = req.meta
                try:
                    await ex.infer(req.raw, request_id=rid)
                except USGError as exc:
                    errors.append(f"{req.name}: {exc}")
                done += 1
                if progress is not None:
                    progress(done, len(requests))

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))


def build_profile(
    graph: Graph,
    folder: Path,
    *,
    config: MonitorConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run every sample request through ``graph`` and return the reference profile (a JSON-able dict)."""
    from usg.monitor.drift import require_scipy

    require_scipy("usg profile")
    config = config or monitor_config(graph)
    requests = collect_requests(graph, folder)
    tap = Tap(graph, config)
    collector = _Collector(tap)
    errors: list[str] = []
    asyncio.run(_run_all(graph, collector, requests, progress, errors))
    if not collector.observations:
        raise UsageError(
            f"no sample request ran through graph {graph.name!r}: {errors[0] if errors else 'no requests'}; "
            "fix: pass inputs the graph accepts"
        )
    observations = [collector.observations[k] for k in sorted(collector.observations)]
    body = summarize(observations, tap.input_modalities, config.outputs, cap=config.reference_size)
    return {
        "format": PROFILE_FORMAT,
        "graph": graph_digests(graph),
        "monitor": {"window": config.window.describe(), "thresholds": config.thresholds.to_dict()},
        "failed": errors,
        **body,
    }


def write_profile(profile: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(profile, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read a profile written by ``usg profile`` (or a window from ``GET /v1/monitor/window``)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"profile {p} does not exist; fix: create it with `usg profile GRAPH --inputs DIR -o {p}`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise UsageError(
            f"profile {p} is not readable JSON ({why}); fix: pass a file written by `usg profile`"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(
            f"{p} is not a USG profile (format {got!r}, expected {PROFILE_FORMAT!r}); fix: use `usg profile`"
        )
    check_profile(doc, str(p))
    return doc
