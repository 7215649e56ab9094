"""usg doctor logs: messages that state their cause but stayed unclassified under leave-one-project-out (session 19) —
mostly behind the conflict gate, where the closest known cases came from other engines' messages.

Each rule is tested on phrasings other than the corpus entry it came from (another release's wording, another model,
another package), and on a near miss it must leave alone."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text


def _codes(text: str) -> set[str]:
    return {f.code for f in classify_text(text, "pasted.log", learned=False)}


@pytest.mark.parametrize(
    ("text", "op", "opset"),
    [
        # ONNX Runtime before 1.0 said "for the node Op(n)"; later releases "for Op(n) node with name '...'"
        (
            "RuntimeError: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for the node "
            "Resize(10)",
            "Resize",
            10,
        ),
        (
            "onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : "
            "Could not find an implementation for ConvInteger(10) node with name 'conv1'",
            "ConvInteger",
            10,
        ),
    ],
)
def test_no_kernel_for_an_op_in_either_wording(text: str, op: str, opset: int) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG009", RootCause.UNSUPPORTED_OP)
    assert (root.evidence["op"], root.evidence["opset"]) == (op, opset)


def test_tensorrt_plugin_fallback_without_a_plugin_is_an_unsupported_op() -> None:
    text = (
        '[E] [TRT] ModelImporter.cpp:773: While parsing node number 12 [GridSample -> "output"]:\n'
        "[E] [TRT] ModelImporter.cpp:776: ERROR: builtin_op_importers.cpp:4890 In function "
        "importFallbackPluginImporter:\n"
        '[8] Assertion failed: creator && "Plugin not found, are the plugin name, version, and namespace correct?"'
    )
    assert "LOG019" in _codes(text)
    assert root_of(text).root_cause is RootCause.UNSUPPORTED_OP


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "E1102 09:12:44.100 1 model_repository_manager.cc:1186] Poll failed for model directory 'bert': failed "
            "to open text file for read /models/bert/config.pbtxt: No such file or directory",
            "config_path",
            "/models/bert/config.pbtxt",
        ),
        (
            "Poll failed for model directory 'detector': Invalid model name: Could not determine backend for model "
            "'detector' with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'.",
            "model",
            "detector",
        ),
    ],
)
def test_triton_model_directory_without_a_usable_config_is_config(text: str, key: str, value: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG077", RootCause.CONFIG_INVALID)
    assert root.evidence[key] == value


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        (
            "E0412 failed to load 'resnet' version 1: Internal: trt failed to set binding dimension to [64,3,224,224] "
            "for input 'images' for resnet_0",
            {"input": "images", "shape": [64, 3, 224, 224]},
        ),
        (
            "[TRT] [E] 3: [executionContext.cpp::setInputShape::2309] Error Code 3: API Usage Error (Parameter check "
            "failed at: runtime/api/executionContext.cpp::setInputShape::2309, condition: satisfyProfile Runtime "
            "dimension does not satisfy any optimization profile.)",
            {},
        ),
        (
            "ValueError: Couldn't assign input_ids with shape torch.Size([16, 4096]), engine supports [min, opt, max] "
            "= [(1, 1), (4, 512), (8, 1024)]",
            {"input": "input_ids", "shape": [16, 4096]},
        ),
    ],
)
def test_a_shape_outside_the_engine_profile_is_a_fixed_dynamic_shape(text: str, evidence: dict[str, object]) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG078", RootCause.DYNAMIC_SHAPE_FIXED)
    assert {k: root.evidence.get(k) for k in evidence} == evidence


@pytest.mark.parametrize(
    ("text", "batch", "engine_max"),
    [
        (
            "[TensorRT] ERROR: Parameter check failed at: engine.cpp::enqueue::292, condition: batchSize > 0 && "
            "batchSize <= mEngine.getMaxBatchSize(). Note: Batch size was: 4, but engine max batch size was: 2",
            4,
            2,
        ),
        (
            "failed to load 'plan' version 1: Invalid argument: unexpected configuration maximum batch size 8 for "
            "'plan_0_0_gpu0', model maximum is 4",
            8,
            4,
        ),
    ],
)
def test_a_batch_above_the_engine_maximum_is_batch_config(text: str, batch: int, engine_max: int) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG083", RootCause.BATCH_DIM_CONFIG)
    assert (root.evidence["batch"], root.evidence["engine_max_batch"]) == (batch, engine_max)


@pytest.mark.parametrize(
    ("text", "key", "model_context"),
    [
        (
            "ValueError: User-specified max_model_len (32768) is greater than the derived max_model_len "
            "(max_position_embeddings=4096 or model_max_length=None in model's config.json). This may lead to "
            "incorrect model outputs or CUDA errors.",
            "max_model_len",
            4096,
        ),
        (
            "ValueError: User-specified context_length (65536) is greater than the derived context_length (32768). "
            "This may lead to incorrect model outputs or CUDA errors.",
            "context_length",
            32768,
        ),
    ],
)
def test_a_context_longer_than_the_model_declares_is_config(text: str, key: str, model_context: int) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG079", RootCause.CONFIG_INVALID)
    assert root.evidence["model_context"] == model_context
    assert key in root.evidence


@pytest.mark.parametrize(
    ("text", "model_type"),
    [
        (
            "ValueError: Trying to export a mamba model, that is a custom or unsupported architecture for the task "
            "text-generation, but no custom onnx configuration was passed as `custom_onnx_configs`.",
            "mamba",
        ),
        (
            "ValueError: Trying to export a phi3-v model, that is a custom or unsupported architecture, but no custom "
            "export configuration was passed as `custom_export_configs`.",
            "phi3-v",
        ),
        (
            "NotImplementedError: Tried to use ORTOptimizer for the model type deberta-v2, but it is not available "
            "yet.",
            "deberta-v2",
        ),
    ],
)
def test_an_exporter_without_a_config_for_the_architecture_is_unsupported(text: str, model_type: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG080", RootCause.UNSUPPORTED_OP)
    assert root.evidence["model_type"] == model_type


def test_the_weights_only_default_of_pytorch_2_6_is_a_release_change() -> None:
    text = (
        "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two "
        "options, do those steps only if you trust the source of the checkpoint.\n"
        "\t(1) In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` from "
        "`False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed.\n"
        "\tWeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default."
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG081", RootCause.VERSION_COUPLING)
    assert root.evidence == root.evidence | {"changed_in": "2.6", "global": "argparse.Namespace"}


def test_weights_only_without_the_release_sentence_names_no_cause() -> None:
    # an older PyTorch, weights_only=True passed by the caller: nothing in the message says a release changed
    text = "_pickle.UnpicklingError: Weights only load failed. Re-running `torch.load` with `weights_only` set to False"
    assert "LOG081" not in _codes(text)


@pytest.mark.parametrize(
    ("text", "package", "minimum", "installed"),
    [
        (
            "Exception: flashinfer with minimum required version 0.2.3 is not installed. Please uninstall the old "
            "version",
            "flashinfer",
            "0.2.3",
            None,
        ),
        ("ImportError: accelerate>=0.26.0 is required but found 0.21.0", "accelerate", "0.26.0", "0.21.0"),
        ("RuntimeError: transformers version >= 4.40.0 is required, got 4.36.2", "transformers", "4.40.0", "4.36.2"),
    ],
)
def test_a_package_below_the_required_minimum_is_version_coupling(
    text: str, package: str, minimum: str, installed: str | None
) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG082", RootCause.VERSION_COUPLING)
    assert (root.evidence["package"], root.evidence["minimum"], root.evidence.get("installed")) == (
        package,
        minimum,
        installed,
    )


def test_a_driver_or_cuda_minimum_is_not_read_as_a_package() -> None:
    assert "LOG082" not in _codes("RuntimeError: CUDA version >= 12.1 is required")


@pytest.mark.parametrize(
    ("text", "tensors"),
    [
        (
            "[TRT-LLM] [E] The following expected tensors are not found: {'host_context_progress', "
            "'host_runtime_perf_knobs'}",
            ["host_context_progress", "host_runtime_perf_knobs"],
        ),
        (
            "[TensorRT-LLM][ERROR] Input tensor 'cache_indirection' not found; expected shape: (-1, -1, -1) "
            "(/src/tensorrt_llm/runtime/tllmRuntime.cpp:214)",
            ["cache_indirection"],
        ),
    ],
)
def test_engine_tensors_the_tensorrt_llm_runtime_expects_are_another_release(text: str, tensors: list[str]) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG084", RootCause.VERSION_COUPLING)
    assert root.evidence["tensors"] == tensors


@pytest.mark.parametrize(
    "text",
    [
        "ImportError: No module named tensorrt",  # Python 2's wording
        "(ServeReplica pid=811) ModuleNotFoundError : No module named helpers",
    ],
)
def test_a_missing_module_without_quotes_is_read(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG043", RootCause.ENVIRONMENT)


@pytest.mark.parametrize(
    ("text", "symbol"),
    [
        (
            "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.29' not found (required by "
            "/opt/conda/lib/python3.10/site-packages/tensorrt_llm/libs/libth_common.so)",
            "GLIBCXX_3.4.29",
        ),
        (
            "OSError: /lib64/libc.so.6: version `GLIBC_2.28' not found (required by /usr/local/lib/libopenvino.so)",
            "GLIBC_2.28",
        ),
        ("/usr/lib/libstdc++.so.6: version `CXXABI_1.3.13' not found", "CXXABI_1.3.13"),
    ],
)
def test_a_system_c_runtime_older_than_the_binary_is_the_environment(text: str, symbol: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG085", RootCause.ENVIRONMENT)
    assert root.evidence["symbol_version"] == symbol


@pytest.mark.parametrize(
    ("text", "module"),
    [
        (
            "ImportError: DLL load failed while importing _pyopenvino: The specified module could not be found.",
            "_pyopenvino",
        ),
        (
            "System.DllNotFoundException: Unable to load DLL 'onnxruntime_providers_cuda.dll': The specified module "
            "could not be found.",
            "onnxruntime_providers_cuda.dll",
        ),
    ],
)
def test_a_windows_dll_that_is_not_found_is_the_environment(text: str, module: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG086", RootCause.ENVIRONMENT)
    assert root.evidence["module"] == module


def test_a_dll_without_the_procedure_is_not_a_missing_dll() -> None:
    text = "ImportError: DLL load failed while importing _C: The specified procedure could not be found."
    assert "LOG086" not in _codes(text)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (
            "ValueError: '<class 'vllm.transformers_utils.configs.ovis.OvisConfig'>' is already used by a Transformers "
            "model.",
            "OvisConfig",
        ),
        ("ValueError: 'aimv2' is already used by a Transformers config, pick another name.", "aimv2"),
    ],
)
def test_a_name_transformers_already_registers_is_a_newer_transformers(text: str, name: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG087", RootCause.VERSION_COUPLING)
    assert root.evidence["name"] == name


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        (
            "torch._dynamo.exc.Unsupported: unsupported operator: aten._fft_c2r.default (see "
            "https://docs.google.com/document/d/1GgvOe7C8_NVOMLOCwDaYV1mXXyHMXY7ExoewHqooxrs)",
            ["aten._fft_c2r.default"],
        ),
        ("torch._dynamo.exc.Unsupported: Dynamic control flow is not supported at the moment.", None),
        (
            "RuntimeErrorWithDiagnostic: Unsupported FX nodes: {'call_function': ['aten.roll.default']}.",
            ["aten.roll.default"],
        ),
    ],
)
def test_what_the_dynamo_exporter_cannot_trace_is_unsupported(text: str, ops: list[str] | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG088", RootCause.UNSUPPORTED_OP)
    assert root.evidence.get("ops") == ops


@pytest.mark.parametrize(
    "text",
    [
        "ValueError: GPTBigCodeForCausalLM does not support Flash Attention 2.0 yet. Please request to add support",
        "ValueError: MllamaForConditionalGeneration does not support an attention implementation through "
        "torch.nn.functional.scaled_dot_product_attention yet.",
    ],
)
def test_a_model_class_without_the_attention_implementation_is_unsupported(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG089", RootCause.UNSUPPORTED_OP)


def test_cuda_failing_to_count_the_gpus_is_the_environment() -> None:
    text = (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG090", RootCause.ENVIRONMENT)
    assert root.evidence["cuda_error"] == 802


def test_a_repository_config_without_model_type_is_config() -> None:
    text = (
        "ValueError: Unrecognized model in ./checkpoints/run-3. Should have a `model_type` key in its config.json, or "
        "contain one of the following strings in its name: albert, bart, bert"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG091", RootCause.CONFIG_INVALID)
    assert root.evidence["repository"] == "./checkpoints/run-3"


def test_remote_model_code_needing_packages_is_the_environment() -> None:
    text = (
        "ImportError: This modeling file requires the following packages that were not found in your environment: "
        "einops, timm. Run `pip install einops timm`"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG092", RootCause.ENVIRONMENT)
    assert root.evidence["packages"] == ["einops", "timm"]


def test_a_backend_of_another_backend_api_names_both_versions() -> None:
    text = (
        "UNAVAILABLE: Unsupported: Triton TRITONBACKEND API version: 1.13 does not support 'python' TRITONBACKEND API "
        "version: 1.15"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG048", RootCause.VERSION_COUPLING)
    assert (root.evidence["server_api"], root.evidence["backend_api"]) == ("1.13", "1.15")


@pytest.mark.parametrize(
    ("text", "backend", "cause"),
    [
        (
            "E0301 failed to load 'encoder' version 1: Invalid argument: unable to find backend library for backend "
            "'pytorch', try specifying runtime on the model configuration.",
            "pytorch",
            RootCause.ENVIRONMENT,
        ),
        (
            "failed to load 'postprocessing' version 1: Invalid argument: unable to find 'vllm/model.py' for model "
            "'postprocessing', in /opt/tritonserver/backends/vllm",
            "vllm",
            RootCause.ENVIRONMENT,
        ),
        (
            "Invalid argument: unable to find backend library for backend '${triton_backend}', try specifying runtime "
            "on the model configuration.",
            "${triton_backend}",
            RootCause.CONFIG_INVALID,
        ),
    ],
)
def test_a_backend_the_server_lacks_is_the_environment_unless_a_placeholder(
    text: str, backend: str, cause: RootCause
) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause, root.evidence["backend"]) == ("LOG093", cause, backend)


def test_a_model_name_no_repository_has_is_config() -> None:
    text = (
        "E1201 model_repository_manager.cc:1234] failed to load model 'yolov8': model not found in any model "
        "repository."
    )
    root = root_of(text)
    assert (root.code, root.root_cause, root.evidence["model"]) == ("LOG094", RootCause.CONFIG_INVALID, "yolov8")


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : "
            "Invalid Feed Input Name:input_1",
            "input",
            "input_1",
        ),
        ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Invalid Output Name:logits", "output", "logits"),
        (
            "ValueError: Required inputs (['pixel_values']) are missing from input feed (['images']).",
            "required",
            "['pixel_values']",
        ),
    ],
)
def test_a_feed_or_output_name_the_model_does_not_have_is_config(text: str, key: str, value: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause, root.evidence[key]) == ("LOG095", RootCause.CONFIG_INVALID, value)


def test_no_opencl_device_for_the_gpu_plugin_is_the_environment() -> None:
    text = (
        "RuntimeError: [GPU] failed to create engine: No OpenCL device found which would match provided "
        "configuration:\n    NVIDIA GeForce RTX 3060: invalid vendor type"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG069", RootCause.ENVIRONMENT)
    assert root.evidence["other_device"] == "NVIDIA GeForce RTX 3060"
