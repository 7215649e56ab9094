"""usg doctor logs: the setup around a model (session 20, rules_setup.py) — a checkpoint saved on a device this machine
lacks, a quantization method or configured value outside the accepted list, a Triton backend library not found (a
platform name given as the backend), a port in use, a program not on PATH, no usable GPU, an OS resource refused, a
shared library not found, a weights/engine file that is not one, two configured limits that contradict each other —
and wording shared across engines: an argument layout of another release (LOG066), transformers' "does not recognize
this architecture" (LOG072), a version requirement in other words (LOG082), TensorRT-LLM's C++ runtime shape range
(LOG078), a linear layer's input features (LOG107), a kernel without the dtype (LOG108).

Each rule is tested on phrasings other than the corpus entry it came from (other devices, releases, models, values,
programs) and on near misses it must leave alone."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text


def _codes(text: str) -> set[str]:
    return {f.code for f in classify_text(text, "pasted.log", learned=False)}


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. "
            "If you are running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu') to "
            "map your storages to the CPU.",
            "saved_on",
            "CUDA",
        ),
        (
            "RuntimeError: Attempting to deserialize object on CUDA device 3 but torch.cuda.device_count() is 2. "
            "Please use torch.load with map_location to map your storages to an existing device.",
            "device_count",
            2,
        ),
        (
            "RuntimeError: Attempting to deserialize object on a MPS device but torch.backends.mps.is_available() is "
            "False.",
            "saved_on",
            "MPS",
        ),
    ],
)
def test_checkpoint_saved_on_a_device_this_machine_lacks(text: str, key: str, value: object) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG096", RootCause.ENVIRONMENT)
    assert root.evidence[key] == value
    assert "map_location" in root.fix


def test_quantization_method_the_release_predates_is_version_coupling() -> None:
    root = root_of(
        '  File "/workspace/vllm/config.py", line 137, in _verify_quantization\n'
        "ValueError: Unknown quantization method: gptq_marlin. Must be one of ['awq', 'gptq', 'squeezellm']."
    )
    assert (root.code, root.root_cause) == ("LOG097", RootCause.VERSION_COUPLING)
    assert root.evidence["quantization"] == "gptq_marlin"
    assert root.evidence["allowed"] == ["awq", "gptq", "squeezellm"]


def test_misspelled_quantization_method_is_config_invalid() -> None:
    root = root_of(
        "ValueError: Unknown quantization method: GPTQ-Marlin. Must be one of ['awq', 'gptq', 'gptq_marlin']."
    )
    assert (root.code, root.root_cause) == ("LOG097", RootCause.CONFIG_INVALID)
    assert root.evidence["meant"] == "gptq_marlin"


def test_unknown_quantization_name_is_left_to_the_known_cases() -> None:
    text = "ValueError: Unknown quantization method: mymethod. Must be one of ['awq', 'gptq']."
    assert "LOG097" not in _codes(text)


@pytest.mark.parametrize(
    ("platform", "backend"),
    [("tensorrt_plan", "tensorrt"), ("onnxruntime_onnx", "onnxruntime"), ("pytorch_libtorch", "pytorch")],
)
def test_triton_platform_name_given_as_backend_is_config_invalid(platform: str, backend: str) -> None:
    root = root_of(
        f"E0412 10:01:02.123 1 model_lifecycle.cc:626] failed to load 'det' version 1: Invalid argument: unable to "
        f"find 'libtriton_{platform}.so' for model 'det', searched: /models/det/1, /models/det, "
        f"/opt/tritonserver/backends/{platform}"
    )
    assert (root.code, root.root_cause) == ("LOG098", RootCause.CONFIG_INVALID)
    assert root.evidence["platform_backend"] == backend
    assert f'backend: "{backend}"' in root.fix


def test_triton_backend_library_missing_is_environment() -> None:
    # status-prefixed line: no error word a generic reader flags, the rule reads it
    root = root_of("UNAVAILABLE: Invalid argument: unable to find 'libtriton_openvino.so' for model 'resnet'")
    assert (root.code, root.root_cause) == ("LOG098", RootCause.ENVIRONMENT)
    assert root.evidence["backend"] == "openvino"


@pytest.mark.parametrize(
    ("text", "port"),
    [
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
            8000,
        ),
        ("OSError: [Errno 98] Address already in use", None),
        ("listen tcp :8001: bind: address already in use", 8001),
        ("Error: listen EADDRINUSE: address already in use :::3000", 3000),
    ],
)
def test_port_in_use(text: str, port: int | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG099", RootCause.ENVIRONMENT)
    assert root.evidence.get("port") == port


@pytest.mark.parametrize(
    ("text", "program"),
    [
        ("/bin/sh: 1: trtllm-build: not found", "trtllm-build"),
        ("bash: nvidia-smi: command not found", "nvidia-smi"),
        ("/bin/bash: line 1: tritonserver: command not found", "tritonserver"),
        ("optimum-cli: command not found", "optimum-cli"),
    ],
)
def test_program_not_on_path(text: str, program: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG100", RootCause.ENVIRONMENT)
    assert root.evidence["program"] == program


def test_not_found_inside_a_sentence_is_not_a_missing_program() -> None:
    assert "LOG100" not in _codes("Error: model file: not found in repository")


@pytest.mark.parametrize(
    ("text", "meant"),
    [
        ("ValueError: Invalid attention backend 'FLASHATTN'. Must be one of ['FLASH_ATTN', 'XFORMERS']", "FLASH_ATTN"),
        ("ValueError: Unsupported dtype 'bfloat'. Supported values are ('float16', 'bfloat16', 'float32')", "bfloat16"),
        ("ValueError: Unknown task 'text-generaton', expected one of [text-generation, feature-extraction]", None),
    ],
)
def test_value_misspelling_a_listed_one_is_config_invalid(text: str, meant: str | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG101", RootCause.CONFIG_INVALID)
    assert root.evidence["meant"] == (meant or "text-generation")


def test_value_absent_from_the_list_without_a_near_miss_is_left_alone() -> None:
    # a model type or feature the release does not have yet is not a typo: the message does not say which
    text = "ValueError: Unsupported model type 'mamba2'. Must be one of ['llama', 'mistral', 'qwen2']"
    assert "LOG101" not in _codes(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("AssertionError: Torch not compiled with CUDA enabled", "cpu-only torch build"),
        ("RuntimeError: No CUDA GPUs are available", "no visible GPU"),
        (
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
            "installed a driver from http://www.nvidia.com/Download/index.aspx",
            "no NVIDIA driver",
        ),
    ],
)
def test_no_usable_gpu(text: str, reason: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG102", RootCause.ENVIRONMENT)
    assert root.evidence["reason"] == reason


@pytest.mark.parametrize(
    ("text", "errno", "path"),
    [
        ("OSError: [Errno 28] No space left on device", 28, None),
        (
            "PermissionError: [Errno 13] Permission denied: '/models/.cache/huggingface'",
            13,
            "/models/.cache/huggingface",
        ),
        ("OSError: [Errno 24] Too many open files", 24, None),
    ],
)
def test_os_resource(text: str, errno: int, path: str | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG103", RootCause.ENVIRONMENT)
    assert (root.evidence["errno"], root.evidence.get("path")) == (errno, path)


def test_shared_memory_too_small() -> None:
    root = root_of(
        "RuntimeError: DataLoader worker (pid 4711) is killed by signal: Bus error. It is possible that dataloader's "
        "workers are out of shared memory. Please try to raise your shared memory limit."
    )
    assert (root.code, root.root_cause) == ("LOG103", RootCause.ENVIRONMENT)
    assert "--shm-size" in root.fix


@pytest.mark.parametrize(
    ("text", "library"),
    [
        ("ImportError: libmpi.so.12: cannot open shared object file: No such file or directory", "libmpi.so.12"),
        ("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory", "libcuda.so.1"),
        (
            "OSError: /opt/conda/lib/python3.10/site-packages/torch_tensorrt/lib/libtorchtrt.so: cannot open shared "
            "object file: No such file or directory",
            "libtorchtrt.so",
        ),
    ],
)
def test_shared_library_not_found(text: str, library: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG104", RootCause.ENVIRONMENT)
    assert root.evidence["library"] == library


def test_cuda_libraries_keep_their_own_rule() -> None:
    text = "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"
    assert root_of(text).code == "LOG027"


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer", "safetensors"),
        ("_pickle.UnpicklingError: invalid load key, 'v'.", "pickle load key 'v'"),
        (
            "[TRT] [E] 1: [stdArchiveReader.cpp::StdArchiveReader::32] Error Code 1: Serialization (Serialization "
            "assertion magicTagRead == kMAGIC_TAG failed.Magic tag does not match)",
            "TensorRT magic tag",
        ),
    ],
)
def test_file_that_is_not_a_checkpoint_or_plan(text: str, check: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG105", RootCause.CONFIG_INVALID)
    assert check in root.evidence["file_check"]


def test_tensorrt_version_tag_stays_a_version_mismatch() -> None:
    text = (
        "[TRT] [E] 1: [stdArchiveReader.cpp::StdArchiveReader::40] Error Code 1: Serialization (Serialization "
        "assertion stdVersionRead == kSERIALIZATION_VERSION failed.Version tag does not match. Note: Current Version: "
        "213, Serialized Engine Version: 232)"
    )
    assert root_of(text).root_cause is RootCause.VERSION_COUPLING


def test_two_configured_limits_that_contradict() -> None:
    root = root_of(
        "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (4096). This effectively limits the "
        "maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences."
    )
    assert (root.code, root.root_cause) == ("LOG106", RootCause.CONFIG_INVALID)
    assert (root.evidence["max_num_batched_tokens"], root.evidence["max_model_len"]) == (2048, 4096)


def test_a_limit_compared_with_prose_is_not_two_settings() -> None:
    text = "ValueError: The decoder prompt (length 5000) is longer than the maximum model length of 4096."
    assert "LOG106" not in _codes(text)


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("TypeError: Glm4vProcessor.__init__() got multiple values for argument 'tokenizer'", "argument", "tokenizer"),
        (
            "TypeError: LlamaRotaryEmbedding.forward() takes from 2 to 3 positional arguments but 4 were given",
            "given",
            4,
        ),
    ],
)
def test_argument_layout_of_another_release(text: str, key: str, value: object) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG066", RootCause.VERSION_COUPLING)
    assert root.evidence[key] == value


def test_builtin_argument_count_is_left_alone() -> None:
    assert "LOG066" not in _codes("TypeError: str.join() takes exactly one argument (2 given)")


@pytest.mark.parametrize(
    "text",
    [
        "ValueError: The checkpoint you are trying to load has model type `qwen3_vl_moe` but Transformers does not "
        "recognize this architecture. This could be because of an issue with the checkpoint, or because your version "
        "of Transformers is out of date.",
        "  Value error, The checkpoint you are trying to load has model type `glm4v_moe` but\nTransformers does not "
        "recognize this architecture.",
    ],
)
def test_model_type_transformers_does_not_recognize(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG072", RootCause.VERSION_COUPLING)
    assert root.evidence["model_type"] in ("qwen3_vl_moe", "glm4v_moe")


def test_linear_layer_input_features() -> None:
    root = root_of("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 1024x10)")
    assert (root.code, root.root_cause) == ("LOG107", RootCause.SHAPE_OR_RANK)
    assert (root.evidence["input_features"], root.evidence["expected_features"]) == (2048, 1024)


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'", "Half"),
        ("RuntimeError: \"LayerNormKernelImpl\" not implemented for 'BFloat16'", "BFloat16"),
        ("RuntimeError: \"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Int'", "Int"),
    ],
)
def test_kernel_without_the_dtype(text: str, dtype: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG108", RootCause.DTYPE_OR_RANGE)
    assert root.evidence["dtype"] == dtype


def test_tensorrt_llm_runtime_shape_outside_the_engine_range() -> None:
    root = root_of(
        "[TensorRT-LLM][ERROR] Assertion failed: Tensor 'input_ids' has invalid shape (8192), expected in range min "
        "(1), max (4096) (/src/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmRuntime.cpp:154)"
    )
    assert (root.code, root.root_cause) == ("LOG078", RootCause.DYNAMIC_SHAPE_FIXED)
    assert (root.evidence["input"], root.evidence["shape"]) == ("input_ids", [8192])


@pytest.mark.parametrize(
    ("text", "package", "minimum", "installed"),
    [
        (
            "ImportError: accelerate>=0.26.0 is required for a normal functioning of this module, but found "
            "accelerate==0.21.0.",
            "accelerate",
            "0.26.0",
            "0.21.0",
        ),
        (
            "ImportError: tokenizers>=0.19,<0.20 is required for a normal functioning of this module, but found "
            "tokenizers==0.20.3.",
            "tokenizers",
            ">=0.19,<0.20",
            "0.20.3",
        ),
        ("RuntimeError: vLLM requires transformers >= 4.45.0, but found 4.40.0", "transformers", "4.45.0", "4.40.0"),
        (
            "ImportError: This version of transformers requires torch>=2.1, but torch 1.13.1 was found",
            "torch",
            "2.1",
            "1.13.1",
        ),
        (
            "AssertionError: flash_attn version 2.0.4 is not supported, please install flash_attn>=2.1.0",
            "flash_attn",
            "2.1.0",
            "2.0.4",
        ),
    ],
)
def test_version_requirement_in_other_words(text: str, package: str, minimum: str, installed: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG082", RootCause.VERSION_COUPLING)
    assert (root.evidence["package"], root.evidence["minimum"], root.evidence["installed"]) == (
        package,
        minimum,
        installed,
    )


def test_a_cuda_requirement_is_the_machine_not_a_package() -> None:
    assert "LOG082" not in _codes("RuntimeError: vLLM requires CUDA >= 12.1, but found 11.8")
