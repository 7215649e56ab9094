"""Accelerator profiles: memory, memory bandwidth, dense BF16 throughput.

Memory is the capacity the runtime sees (``nvidia-smi`` / ``hl-smi`` total),
bandwidth and BF16 tensor throughput are the vendor datasheet figures for the
*dense* case (sparsity figures halved away). SXM parts are assumed for A100 /
H100 / H200. Custom profiles come from a YAML or JSON file::

    name: MI300X            # or a list of such mappings, or {profiles: [...]}
    memory_gb: 192          # GiB visible to the runtime (or memory_bytes)
    bandwidth_gbps: 5300    # GB/s (10^9 bytes per second)
    bf16_tflops: 1307       # dense
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from usg.errors import InputError, UsageError
from usg.yaml_bounded import load_bounded, read_bounded_text

__all__ = ["GPU_PROFILES", "GPUProfile", "get_gpu", "load_gpu_profiles", "parse_gpu_spec"]

_MIB = 1024**2
_GIB = 1024**3


@dataclass(frozen=True)
class GPUProfile:
    """One accelerator. ``memory_bytes`` is per device; ``bandwidth`` in bytes/s; ``bf16_flops`` in FLOP/s."""

    name: str
    memory_bytes: int
    bandwidth: float
    bf16_flops: float
    note: str = ""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / _GIB

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "memory_gib": round(self.memory_gib, 2),
            "bandwidth_gbps": self.bandwidth / 1e9,
            "bf16_tflops": self.bf16_flops / 1e12,
            "note": self.note,
        }


def _gpu(name: str, mib: int, gbps: float, tflops: float, note: str = "") -> GPUProfile:
    return GPUProfile(name, mib * _MIB, gbps * 1e9, tflops * 1e12, note)


GPU_PROFILES: dict[str, GPUProfile] = {
    p.name: p
    for p in (
        _gpu("A10G", 23028, 600, 125, "24 GB GDDR6 (AWS g5)"),
        _gpu("L4", 23034, 300, 121, "24 GB GDDR6"),
        _gpu("A100-40GB", 40960, 1555, 312, "SXM4, HBM2"),
        _gpu("A100-80GB", 81920, 2039, 312, "SXM4, HBM2e"),
        _gpu("H100-80GB", 81559, 3350, 989, "SXM5, HBM3"),
        _gpu("H200-141GB", 143771, 4800, 989, "SXM, HBM3e"),
        _gpu("Gaudi2-96GB", 98304, 2460, 432, "Intel Gaudi2 HL-225H, HBM2e"),
        _gpu("Jetson-AGX-Orin-64GB", 65536, 204.8, 42.5, "LPDDR5 shared with the CPU and OS"),
    )
}
_ALIASES = {
    "a10": "A10G",
    "h100": "H100-80GB",
    "h100sxm": "H100-80GB",
    "h200": "H200-141GB",
    "gaudi2": "Gaudi2-96GB",
    "hl225h": "Gaudi2-96GB",
    "orin": "Jetson-AGX-Orin-64GB",
    "jetsonorin": "Jetson-AGX-Orin-64GB",
    "agxorin": "Jetson-AGX-Orin-64GB",
    "jetsonagxorin": "Jetson-AGX-Orin-64GB",
    "a10040g": "A100-40GB",
    "a10080g": "A100-80GB",
    "h10080g": "H100-80GB",
    "h200141g": "H200-141GB",
}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def get_gpu(name: str, custom: dict[str, GPUProfile] | None = None) -> GPUProfile:
    """Look up a profile by name (case and punctuation insensitive), custom profiles first."""
    table = {**GPU_PROFILES, **(custom or {})}
    index = {_key(n): p for n, p in table.items()}
    index.update({k: table[v] for k, v in _ALIASES.items() if k not in index})
    found = index.get(_key(name))
    if found is not None:
        return found
    if _key(name) == "a100":
        raise UsageError(
            "--gpu 'A100' is ambiguous; fix: say A100-40GB or A100-80GB (nvidia-smi shows the memory size)"
        )
    close = difflib.get_close_matches(name, list(table), n=2, cutoff=0.4)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UsageError(
        f"--gpu {name!r} is not a known GPU; {hint}fix: use one of {', '.join(table)}, "
        "or describe it in a profile file "
        "(--gpu-file gpus.yaml with name, memory_gb, bandwidth_gbps, bf16_tflops)"
    )


def parse_gpu_spec(spec: str, custom: dict[str, GPUProfile] | None = None) -> tuple[GPUProfile, int]:
    """``NAME[xN]`` (e.g. ``H100x8``, ``A100-80GBx2``), or a profile file path, → (profile, count)."""
    text = spec.strip()
    count = 1
    match = re.fullmatch(r"(.+?)\s*[x×*]\s*(-?\d+)", text, flags=re.IGNORECASE)
    if match:
        text, count = match.group(1), int(match.group(2))
    if count < 1:
        raise UsageError(f"--gpu {spec!r}: GPU count {count} must be >= 1; fix: write NAME or NAMExN, e.g. L4x2")
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        profiles = load_gpu_profiles(path)
        if len(profiles) != 1:
            raise UsageError(
                f"{path} defines {len(profiles)} profiles ({', '.join(profiles)}); "
                "fix: pass --gpu-file FILE --gpu NAME to pick one"
            )
        return next(iter(profiles.values())), count
    return get_gpu(text, custom), count


def load_gpu_profiles(path: str | Path) -> dict[str, GPUProfile]:
    """Read custom profiles from YAML/JSON: one mapping, a list of them, or ``{profiles: [...]}``."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"GPU profile file {str(p)!r} does not exist; fix: pass an existing .yaml or .json file")
    try:
        text = read_bounded_text(p)
        data = json.loads(text) if p.suffix.lower() == ".json" else load_bounded(text)
    except RecursionError:
        raise InputError(f"{p}: cannot parse GPU profiles (nested too deeply); fix: write valid YAML/JSON") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError, size
        raise InputError(f"{p}: cannot parse GPU profiles ({exc}); fix: write valid YAML/JSON") from None
    if isinstance(data, dict) and "profiles" in data:
        data = data["profiles"]
    items = data if isinstance(data, list) else [data]
    out: dict[str, GPUProfile] = {}
    for i, item in enumerate(items):
        prof = _profile_from(item, f"{p}[{i}]" if isinstance(data, list) else str(p))
        out[prof.name] = prof
    return out


def _profile_from(item: object, where: str) -> GPUProfile:
    if not isinstance(item, dict):
        raise InputError(f"{where}: a GPU profile must be a mapping, got {item!r}; fix: see usg plan --help")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: field 'name' is missing or empty (got {name!r}); fix: add name: MY-GPU")

    def number(*keys: str) -> float:
        for key in keys:
            if key in item:
                value = item[key]
                if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                    raise InputError(
                        f"{where}: field {key!r} must be a finite, positive number (got {value!r}); "
                        f"fix: take it from the {name} datasheet"
                    )
                return float(value)
        raise InputError(
            f"{where}: field {keys[0]!r} is missing for GPU {name!r}; fix: add {keys[0]} from the datasheet"
        )

    memory = int(number("memory_bytes")) if "memory_bytes" in item else int(number("memory_gb") * _GIB)
    return GPUProfile(
        name=name,
        memory_bytes=memory,
        bandwidth=number("bandwidth_gbps") * 1e9,
        bf16_flops=number("bf16_tflops") * 1e12,
        note=str(item.get("note", "custom profile")),
    )
