"""usg doctor logs: families that stayed unclassified (or were misread) under leave-one-project-out and state their
cause (session 18) — a compiled extension missing a symbol of the PyTorch/TensorRT-LLM it was built against, a
tensor-parallel size the model or the node cannot be split by, a missing module whose message names the install.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text


@pytest.mark.parametrize(
    ("text", "owner", "library"),
    [
        # vllm-project/vllm#26452 (pplx kernels built against another PyTorch)
        (
            "OSError: /path/to/libpplx_kernels.so: undefined symbol: _ZN3c104cuda9SetDeviceEab",
            "PyTorch",
            "libpplx_kernels.so",
        ),
        # NVIDIA/TensorRT-LLM#1408 (bindings of another TensorRT-LLM build than the libraries beside them)
        (
            "import tensorrt_llm.bindings as tllm\n"
            "ImportError: /usr/local/lib/python3.10/dist-packages/tensorrt_llm/"
            "bindings.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZNK12tensorrt_llm8executor25Speculati",
            "TensorRT-LLM",
            "bindings.cpython-310-x86_64-linux-gnu.so",
        ),
    ],
)
def test_an_undefined_symbol_of_a_known_library_names_the_release_it_was_built_for(
    text: str, owner: str, library: str
) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG076", RootCause.VERSION_COUPLING)
    assert (root.evidence["built_against"], root.evidence["library"]) == (owner, library)
    assert f"another {owner} release" in root.message


def test_an_undefined_symbol_of_an_unknown_library_is_left_to_known_cases() -> None:
    # triton-inference-server/server#5561: the user's own backend library; whose release is not in the message
    text = (
        "Not found: unable to load shared library: /.../libtriton_custom_backend.so: undefined symbol: "
        "_ZN6xxx6IoDescC1Ev"
    )
    assert all(f.code != "LOG076" for f in classify_text(text, "pasted.log", learned=False))


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        # MIV-XJTU/FSDrive#21 (12 heads over 8 GPUs)
        (
            "ValueError: Total number of attention heads (12) must be divisible by tensor parallel size (8).",
            {"of": "Total number of attention heads", "size": 12, "tensor_parallel_size": 8},
        ),
        # vllm-project/vllm#596 (3 GPUs per node, tensor parallel size 2)
        (
            "ValueError: The number of GPUs per node is not divisible by the number of tensor parallelism.",
            {"of": "number of GPUs per node"},
        ),
        # huggingface/text-generation-inference#523 (a vocabulary of 65027 over 4 shards)
        (
            "AssertionError: The choosen size 65027 is not compatible with sharding on 4 shards",
            {"size": 65027, "shards": 4},
        ),
    ],
)
def test_a_tensor_parallel_size_the_model_cannot_be_split_by_is_config(text: str, evidence: dict[str, object]) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG075", RootCause.CONFIG_INVALID)
    assert {k: root.evidence[k] for k in evidence} == evidence


def test_a_missing_module_whose_message_names_the_install_is_the_environment() -> None:
    # ray-project/ray#23064: the Serve extra was not installed; the message says so
    root = root_of(
        "ModuleNotFoundError: No module named 'ray.serve.generated'. You can run `pip install \"ray[serve]\"` to "
        "install all Ray Serve dependencies."
    )
    assert (root.code, root.root_cause) == ("LOG043", RootCause.ENVIRONMENT)
    assert root.evidence["install"] == 'pip install "ray[serve]"'


def test_a_missing_submodule_without_its_closing_quote_is_still_read() -> None:
    # sgl-project/sglang#362: vllm 0.4.0 dropped the module sglang imported
    root = root_of("ModuleNotFoundError: No module named 'vllm.model_executor.input_metadata")
    assert (root.code, root.root_cause) == ("LOG043", RootCause.VERSION_COUPLING)
    assert root.evidence["module"] == "vllm.model_executor.input_metadata"
