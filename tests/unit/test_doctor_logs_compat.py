"""usg doctor logs: OpenVINO's check-failure form, build/GPU compatibility rules, and rules refined from
what real threads resolved (the messages are real wordings users pasted; signature rules only)."""

from __future__ import annotations

from logs_roots import root_of

from usg.doctor.findings import RootCause, Severity
from usg.doctor.logs.classify import classify_text


def test_openvino_check_failed_reads_the_message_below_it() -> None:
    root = root_of(
        "model-server-1  | Standard exception from compilation library: [ GENERAL_ERROR ] Check 'allocatable' failed "
        "at src/plugins/intel_gpu/src/runtime/ocl/ocl_engine.cpp:149:\n"
        "model-server-1  | [GPU] Exceeded max size of memory allocation, check debug message for size info"
    )
    assert (root.code, root.root_cause) == ("LOG035", RootCause.MEMORY)
    assert root.evidence["component"] == "GPU plugin" and root.evidence["check"] == "allocatable"
    assert root.evidence["message"].startswith("[GPU] Exceeded max size")  # the compose prefix is dropped


def test_openvino_allocation_size_is_evidence() -> None:
    root = root_of(
        "Check 'ptr' failed at src/plugins/intel_cpu/src/cpu_memory.cpp:257:\n"
        "Failed to allocate 7663872811008 bytes of memory"
    )
    assert root.code == "LOG035" and root.evidence["bytes_requested"] == 7663872811008
    assert root.evidence["gib_requested"] == 7137.5 and "static input shapes" in root.fix


def test_openvino_nested_exceptions_name_the_innermost_component_and_the_op() -> None:
    root = root_of(
        "[OpenVINO-EP]  Exception while Loading Network for graph: OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0"
        "Exception from src/inference/src/cpp/core.cpp:104:\n"
        "Exception from src/inference/src/dev/plugin.cpp:53:\n"
        "Exception from src/plugins/intel_cpu/src/node.cpp:87:\n"
        "Unexpected: CPU plug-in doesn't support If operation with dynamic rank. Operation name: input.15"
    )
    assert (root.code, root.root_cause) == ("LOG035", RootCause.UNSUPPORTED_OP)
    assert root.evidence["component"] == "CPU plugin" and root.evidence["operations"] == "If"


def test_openvino_node_validation_is_not_forced_into_a_class() -> None:
    # the model's shapes or the converter: the rule abstains, the line stays for known cases
    [f] = classify_text(
        "[ ERROR ]  Check 'i < input_pshape.rank().get_length()' failed at src/core/src/op/reshape.cpp:391:\n"
        "While validating node 'v1::Reshape Reshape_428470' with friendly_name 'Reshape_428470':\n"
        "'0' dimension is out of range",
        learned=False,
    )
    assert f.code == "LOG000"


def test_tensorrt_plan_from_another_tensorrt_or_gpu() -> None:
    version = root_of(
        "[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible with this version of TensorRT, expecting "
        "library version 9.2.0.5 got 9.3.0.1, please rebuild."
    )
    assert (version.code, version.root_cause) == ("LOG038", RootCause.VERSION_COUPLING)
    assert (version.evidence["runtime_tensorrt"], version.evidence["engine_tensorrt"]) == ("9.2.0.5", "9.3.0.1")
    device = root_of(
        "The engine plan file is generated on an incompatible device, expecting compute 9.0 got compute 8.9, "
        "please rebuild."
    )
    assert (device.code, device.root_cause) == ("LOG038", RootCause.ENVIRONMENT)
    assert device.evidence["engine_compute_capability"] == "8.9" and "compute 9.0" in device.fix


def test_listed_architecture_reported_unsupported_is_a_failed_import() -> None:
    root = root_of(
        "ValueError: Model architectures ['LlamaForCausalLM'] are not supported for now. Supported architectures: "
        "['AquilaModel', 'LlamaForCausalLM', 'MistralForCausalLM']"
    )
    assert (root.code, root.root_cause) == ("LOG042", RootCause.ENVIRONMENT)
    assert root.evidence["listed_as_supported"] is True
    # an architecture the engine does not list: not implemented or newer than the release; no rule decides
    [f] = classify_text(
        "ValueError: Model architectures ['Glm4ForCausalLM'] are not supported for now. Supported architectures: "
        "dict_keys(['BaichuanForCausalLM', 'ChatGLMModel'])",
        learned=False,
    )
    assert f.code == "LOG000"


def test_flash_attention_missing_is_a_warning_and_the_gpu_limit_an_error() -> None:
    [warn] = classify_text(
        "2024-04-20T07:20:49.339061Z  WARN text_generation_launcher: Could not import Flash Attention enabled "
        "models: Flash Attention is not installed.",
        learned=False,
    )
    assert (warn.code, warn.severity, warn.root_cause) == ("LOG041", Severity.WARNING, RootCause.ENVIRONMENT)
    ampere = root_of("RuntimeError: FlashAttention only supports Ampere GPUs or newer.")
    assert (ampere.code, ampere.root_cause) == ("LOG039", RootCause.ENVIRONMENT)


def test_exporter_opset_and_truncated_ir_version() -> None:
    opset = root_of(
        '    raise ValueError("Unsupported ONNX opset version: " + str(opset_version))\n'
        "ValueError: Unsupported ONNX opset version: 16"
    )
    assert (opset.code, opset.root_cause, opset.evidence["opset"]) == ("LOG040", RootCause.VERSION_COUPLING, 16)
    ir = root_of("onnxruntime::ModelOptions&) Unsupported model IR version: 10, max supported IR version:")
    assert (ir.code, ir.evidence["model_ir"]) == ("LOG010", 10) and "max_ir" not in ir.evidence


def test_image_token_mismatch_refined_by_the_numbers() -> None:
    extra = root_of("ValueError: Image features and image tokens do not match: tokens: 259, features 256")
    assert extra.root_cause is RootCause.CONFIG_INVALID and "format" in extra.fix  # an extra placeholder
    single = root_of("ValueError: Image features and image tokens do not match: tokens: 1, features 297")
    assert single.root_cause is RootCause.VERSION_COUPLING and "processor_config.json" in single.fix
    cls = root_of("ValueError: Image features and image tokens do not match: tokens: 577, features 576")
    # one square patch grid plus a CLS token: a processor setting to correct (num_additional_image_tokens)
    assert cls.root_cause is RootCause.CONFIG_INVALID and "num_additional_image_tokens=0" in cls.fix


def test_axis_zero_of_a_state_input_is_not_a_batch() -> None:
    root = root_of(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: state_in for the following "
        "indices\n index: 0 Got: 45424 Expected: 52592\n Please fix either the inputs/outputs or the model."
    )
    assert (root.code, root.root_cause) == ("LOG006", RootCause.SHAPE_OR_RANK)
    batch = root_of(
        "INVALID_ARGUMENT : Got invalid dimensions for input: input for the following indices\n"
        " index: 0 Got: 8 Expected: 1"
    )
    assert batch.root_cause is RootCause.DYNAMIC_SHAPE_FIXED


def test_import_failures_split_by_what_is_missing() -> None:
    own = root_of(
        "    deployment_def = cloudpickle.loads(serialized_deployment_def)\n"
        "ModuleNotFoundError: No module named 'kaiko.llm_serve'"
    )
    assert (own.code, own.root_cause, own.evidence["module"]) == ("LOG043", RootCause.ENVIRONMENT, "kaiko.llm_serve")
    sub = root_of(
        "Ignore import error when loading sglang.srt.models.qwen2_5_vl. "
        "No module named 'transformers.models.qwen2_5_vl'"
    )
    assert sub.root_cause is RootCause.VERSION_COUPLING and sub.evidence["package"] == "transformers"
    ext = root_of("Failed to import from vllm._C with ModuleNotFoundError(\"No module named 'vllm._C'\")")
    assert ext.root_cause is RootCause.ENVIRONMENT and "compiled extension" in ext.message
    name = root_of("ImportError: cannot import name 'top_k_top_p_sampling_from_probs' from 'flashinfer.sampling'")
    assert name.root_cause is RootCause.VERSION_COUPLING and name.evidence["module"] == "flashinfer.sampling"


def test_openvino_input_that_does_not_fit_the_model() -> None:
    root = root_of(
        "RuntimeError: Can't SetBlob with name: conv2d_36_input, because model input (shape={1,32,32,32}) and blob "
        "(shape=(1.32.32.3)) are incompatible"
    )
    assert (root.code, root.root_cause) == ("LOG044", RootCause.SHAPE_OR_RANK)
    assert root.evidence["model_shape"] == "{1,32,32,32}" and "NHWC" in root.fix
    size = root_of(
        "RuntimeError: The input blob size is not equal to the network input size: got 153600 expecting 98304"
    )
    assert size.evidence["ratio"] == 1.562


def test_request_over_a_default_server_limit_is_the_configuration() -> None:
    default = root_of("ValidationError: Input validation error: `inputs` must have less than 1024 tokens. Given: 1168.")
    assert (default.code, default.root_cause) == ("LOG045", RootCause.CONFIG_INVALID)
    assert default.evidence["default_limit"] is True and "--max-input-tokens" in default.fix
    chosen = root_of(
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 32768. Given: X `inputs` tokens"
    )
    assert chosen.root_cause is RootCause.SHAPE_OR_RANK and chosen.evidence["max_total_tokens"] == 32768
    trtllm = root_of(
        "ValueError: The sum of prompt length (9351.0), query length (0) should not exceed max_num_tokens (8192)"
    )
    assert (trtllm.root_cause, trtllm.evidence["prompt_tokens"]) == (RootCause.SHAPE_OR_RANK, 9351)
