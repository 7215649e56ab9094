"""GPU profiles, NAME[xN] specs and custom profile files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from usg.errors import InputError, UsageError
from usg.plan import get_gpu, load_gpu_profiles, parse_gpu_spec
from usg.plan.hardware import GPU_PROFILES

GIB = 1024**3


def test_required_profiles_exist_with_datasheet_figures() -> None:
    names = {
        "A10G",
        "L4",
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H200-141GB",
        "Gaudi2-96GB",
        "Jetson-AGX-Orin-64GB",
    }
    assert names <= set(GPU_PROFILES)
    h100 = GPU_PROFILES["H100-80GB"]
    assert h100.bandwidth == 3.35e12 and h100.bf16_flops == 989e12
    assert 79 < h100.memory_gib < 80  # what nvidia-smi reports for an "80 GB" part
    assert GPU_PROFILES["L4"].bandwidth == 300e9
    assert GPU_PROFILES["A10G"].bf16_flops == 125e12
    for p in GPU_PROFILES.values():
        assert p.memory_bytes > 16 * GIB and p.bandwidth > 1e11 and p.bf16_flops > 1e13


def test_lookup_is_case_and_punctuation_insensitive() -> None:
    assert get_gpu("h100").name == "H100-80GB"
    assert get_gpu("a100_80gb").name == "A100-80GB"
    assert get_gpu("jetson-orin").name == "Jetson-AGX-Orin-64GB"


def test_spec_with_count() -> None:
    assert parse_gpu_spec("H100x8") == (GPU_PROFILES["H100-80GB"], 8)
    assert parse_gpu_spec("A100-80GBx2") == (GPU_PROFILES["A100-80GB"], 2)
    assert parse_gpu_spec("L4") == (GPU_PROFILES["L4"], 1)


def test_unknown_gpu_suggests_and_lists() -> None:
    with pytest.raises(UsageError, match=r"--gpu 'H1000' is not a known GPU; did you mean .*fix: use one of A10G"):
        get_gpu("H1000")
    with pytest.raises(UsageError, match=r"'A100' is ambiguous; fix: say A100-40GB or A100-80GB"):
        get_gpu("A100")
    with pytest.raises(UsageError, match=r"GPU count 0 must be >= 1"):
        parse_gpu_spec("L4x0")


def test_custom_profiles_yaml_and_json(tmp_path: Path) -> None:
    y = tmp_path / "gpus.yaml"
    y.write_text("- {name: MI300X, memory_gb: 192, bandwidth_gbps: 5300, bf16_tflops: 1307}\n")
    profiles = load_gpu_profiles(y)
    assert profiles["MI300X"].memory_bytes == 192 * GIB
    assert parse_gpu_spec("mi300x", profiles)[0].bandwidth == 5.3e12
    j = tmp_path / "one.json"
    j.write_text(json.dumps({"name": "X1", "memory_bytes": 10 * GIB, "bandwidth_gbps": 100, "bf16_tflops": 50}))
    gpu, n = parse_gpu_spec(f"{j}x4")
    assert (gpu.name, gpu.memory_bytes, n) == ("X1", 10 * GIB, 4)


def test_bad_custom_profiles(tmp_path: Path) -> None:
    p = tmp_path / "gpus.yaml"
    p.write_text("name: X\nmemory_gb: -1\nbandwidth_gbps: 10\nbf16_tflops: 1\n")
    with pytest.raises(InputError, match=r"field 'memory_gb' must be a finite, positive number \(got -1\)"):
        load_gpu_profiles(p)
    p.write_text("name: X\nmemory_gb: 10\nbf16_tflops: 1\n")
    with pytest.raises(InputError, match=r"field 'bandwidth_gbps' is missing for GPU 'X'"):
        load_gpu_profiles(p)
    with pytest.raises(UsageError, match=r"does not exist"):
        load_gpu_profiles(tmp_path / "none.yaml")
