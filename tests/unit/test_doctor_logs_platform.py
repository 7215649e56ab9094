"""usg doctor logs: signatures printed by the engines' own code for installs, hardware, config
validation and build limits (OpenVINO, ONNX Runtime providers, vLLM quantization kernels, Triton
backends, TensorRT plans, Ray/Ray Serve, TGI's launcher, TensorRT-LLM engines, optimum's export check).

Every excerpt is a real message users pasted in a public thread (the URL is beside it) or printed
in a project's docs; the rules key on the engine's wording, never on one thread's values."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text


def test_openvino_ir_from_a_newer_release_is_version_coupling() -> None:
    # openvinotoolkit/open_model_zoo#266, #755
    root = root_of(
        "Error reading network:cannot parse future versions:6\n"
        "..\\src\\inference_engine\\ie_cnn_net_reader_inml.cpp:144"
    )
    assert (root.code, root.root_cause) == ("LOG053", RootCause.VERSION_COUPLING)
    assert root.evidence["ir_version"] == 6 and "upgrade the OpenVINO runtime" in root.fix
    assert root_of("[ ERROR ] Error reading network: cannot parse future versions: 10").evidence["ir_version"] == 10


@pytest.mark.parametrize(
    "text",
    [
        # openvinotoolkit/openvino#17531 (MYRIAD)
        "    super().compile_model(model, device_name, {} if config is None else config)\n"
        "RuntimeError: Cannot get length of dynamic dimension",
        # openvinotoolkit/openvino#12496 (GPU plugin)
        "RuntimeError: get_shape was called on a descriptor::Tensor with dynamic shape",
        # the message under OpenVINO's location chain (src/core/src/dimension.cpp)
        "RuntimeError: Exception from src/core/src/dimension.cpp:227: Cannot get length of dynamic dimension",
    ],
)
def test_openvino_static_shape_required(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG054", RootCause.UNSUPPORTED_OP)
    assert "static input shapes" in root.fix


def test_openvino_precisions_the_plugin_or_the_cpu_lacks() -> None:
    f64 = root_of("CPU plugin does not support f64 for use with oneDNN.")  # openvinotoolkit/openvino#33239
    assert (f64.code, f64.root_cause) == ("LOG055", RootCause.DTYPE_OR_RANGE)
    assert f64.evidence == {**f64.evidence, "precision": "f64", "library": "oneDNN"}
    fp16 = root_of("[ ERROR ] The plugin does not support FP16")  # openvinotoolkit/openvino#124
    assert fp16.root_cause is RootCause.DTYPE_OR_RANGE and fp16.evidence["precision"] == "FP16"
    # the CPU, not the model: openvinotoolkit/openvino#15552
    bf16 = root_of("self.core.set_property(device, config[device])\nRuntimeError: Platform doesn't support BF16 format")
    assert (bf16.code, bf16.root_cause) == ("LOG055", RootCause.ENVIRONMENT)


def test_openvino_gpu_out_of_resources_is_memory() -> None:
    # immich-app/immich#13674: OpenVINO's GPU plugin under ONNX Runtime's OpenVINO EP
    root = root_of(
        "Wait Model Failed: Exception from src/inference/src/cpp/infer_request.cpp:245:\n"
        "Exception from src/plugins/intel_gpu/src/runtime/ocl/ocl_engine.cpp:185:\n"
        "[GPU] out of GPU resources"
    )
    assert (root.code, root.root_cause) == ("LOG056", RootCause.MEMORY)
    oor = root_of(  # openvinotoolkit/openvino#25141
        "\"Due to the driver bug any subsequent OpenCL API call will cause application hang, so GPU plugin can't "
        "finish correctly. Please try to update the driver or reduce memory consumption (use smaller batch size, "
        'less streams, lower precision, etc)to avoid CL_OUT_OF_RESOURCES exception"'
    )
    assert oor.code == "LOG056"


def test_openvino_input_tensor_by_name() -> None:
    # PaddlePaddle/PaddleOCR#11910: the "with name" form of the set-tensor message
    root = root_of(
        "Can't set the input tensor with name: x, because the model input (shape=[?,3,?,?]) and the tensor "
        "(shape=(3.48.110)) are incompatible"
    )
    assert (root.code, root.root_cause) == ("LOG044", RootCause.SHAPE_OR_RANK)
    assert root.evidence["input"] == "x" and root.evidence["sent_shape"] == "(3.48.110)"


def test_tensorrt_serialization_version_tag() -> None:
    # GeekAlexis/FastMOT#127 (TensorRT 7) and NVIDIA/ChatRTX#14 (TensorRT-LLM)
    old = root_of(
        "[TensorRT] ERROR: coreReadArchive.cpp (41) - Serialization Error in verifyHeader: 0 (Version tag does not "
        "match. Note: Current Version: 96, Serialized Engine Version: 97)"
    )
    assert (old.code, old.root_cause) == ("LOG038", RootCause.VERSION_COUPLING)
    assert old.evidence["runtime_serialization_version"] == 96 and old.evidence["engine_serialization_version"] == 97
    new = root_of(
        "Error Code 1: Serialization (Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed."
        "Version tag does not match. Note: Current Version: 228, Serialized Engine Version: 226)"
    )
    assert new.code == "LOG038" and "only one TensorRT" in new.fix


def test_onnxruntime_execution_provider_not_available() -> None:
    # commaai/openpilot#31708: the provider library cannot load its CUDA dependency
    lib = root_of(
        "2024-03-05 11:40:14.847702004 [E:onnxruntime:Default, provider_bridge_ort.cc:1548 TryGetProviderInfo_CUDA] "
        "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:1209 onnxruntime::Provider& "
        "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
        "libonnxruntime_providers_cuda.so with error: libcublasLt.so.11: cannot open shared object file: No such "
        "file or directory"
    )
    assert (lib.code, lib.root_cause) == ("LOG046", RootCause.ENVIRONMENT)
    assert lib.evidence["load_error"].startswith("libcublasLt.so.11")
    # Naozumi520/g2pW-Cantonese#1: the CPU package is installed
    cpu = root_of(
        "UserWarning: Specified provider 'CUDAExecutionProvider' is not in available provider names.Available "
        "providers: 'AzureExecutionProvider, CPUExecutionProvider'"
    )
    assert cpu.code == "LOG046" and "pip install onnxruntime-gpu" in cpu.fix
    assert cpu.evidence["available"] == "AzureExecutionProvider, CPUExecutionProvider"
    # microsoft/onnxruntime#13139 (a warning; the session falls back to CPU)
    bare = root_of(
        "2022-09-28 08:20:21.214094612 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:566 "
        "CreateExecutionProviderInstance] Failed to create CUDAExecutionProvider. Please reference "
        "https://onnxruntime.ai/docs/reference/execution-providers/CUDA-ExecutionProvider.html#requirements to ensure "
        "all dependencies are met."
    )
    assert bare.code == "LOG046" and bare.evidence["provider"] == "CUDAExecutionProvider"


def test_onnxruntime_provider_library_with_an_undefined_symbol_is_a_release_mismatch() -> None:
    # microsoft/onnxruntime#14802: the provider loads, its TensorRT is another release than the build's
    root = root_of(
        "Failed to load library libonnxruntime_providers_tensorrt.so with error: TensorRT/TensorRT-8.2.x/AL2_x86_64/"
        "DEV.STD.PTHREAD/build/lib/libnvinfer_plugin.so.8: undefined symbol: _ZN5pwgen18nvrtcCreateProgramE"
    )
    assert (root.code, root.root_cause) == ("LOG046", RootCause.VERSION_COUPLING)
    assert "another release" in root.message and "was built for" in root.fix
    assert root.evidence["library"] == "libonnxruntime_providers_tensorrt.so"


@pytest.mark.parametrize(
    ("text", "method", "need", "have"),
    [
        # vllm-project/vllm#1488
        (
            "The quantization method awq is not supported for the current GPU. Minimum capability: 75. Current "
            "capability: 70.",
            "awq",
            75,
            70,
        ),
        # vllm-project/vllm#14040 (title): compressed-tensors schemes raise a tuple
        (
            "RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min capability: 80. ', "
            "'Current capability: 75.')",
            None,
            80,
            75,
        ),
    ],
)
def test_quantization_kernels_need_a_newer_gpu(text: str, method: str | None, need: int, have: int) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG047", RootCause.ENVIRONMENT)
    assert root.evidence["min_compute_capability"] == need and root.evidence["compute_capability"] == have
    assert root.evidence.get("quantization") == method


def test_triton_backend_built_for_another_triton() -> None:
    # triton-inference-server/server#2876
    root = root_of(
        "E0519 08:11:54.803470 1 model_repository_manager.cc:1243] failed to load 'PYTHON_NMS' version 1: "
        "Unsupported: Triton backend API version does not support this backend"
    )
    assert (root.code, root.root_cause) == ("LOG048", RootCause.VERSION_COUPLING)


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        # real-stanford/scalingup#6
        (
            "(autoscaler +32s) Error: No available node types can fulfill resource request {'CPU': 1.0, 'GPU': 1.0}. "
            "Add suitable node types to this cluster to resolve this issue.",
            "{'CPU': 1.0, 'GPU': 1.0}",
        ),
        # ray-project/ray-llm#120: the request wrapped onto the next line
        (
            "Error: No available node types can fulfill resource request \n"
            "defaultdict(<class 'float'>, {'accelerator_type_a10': 0.02, 'CPU': 9.0, 'GPU': 1.0}). \n"
            "Add suitable node types to this cluster to resolve this issue.",
            "defaultdict(<class 'float'>, {'accelerator_type_a10': 0.02, 'CPU': 9.0, 'GPU': 1.0})",
        ),
        # rllm-org/rllm#35
        (
            "(autoscaler +34s) Error: No available node types can fulfill resource request defaultdict(<class "
            "'float'>, {'CPU': 8.0, 'GPU': 8.0}). Add suitable node types to this cluster to resolve this issue.",
            "defaultdict(<class 'float'>, {'CPU': 8.0, 'GPU': 8.0})",
        ),
    ],
)
def test_ray_request_no_node_can_satisfy(text: str, request_: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG049", RootCause.CONFIG_INVALID)
    assert root.evidence["request"] == request_


def test_ray_serve_config_validation() -> None:
    # ray-project/ray#33577
    schema = root_of(
        "pydantic.error_wrappers.ValidationError: 4 validation errors for ServeApplicationSchema\n"
        "import_path\n"
        "  field required (type=value_error.missing)\n"
        "applications\n"
        "  extra fields not permitted (type=value_error.extra)"
    )
    assert (schema.code, schema.root_cause) == ("LOG051", RootCause.CONFIG_INVALID)
    assert schema.evidence["schema"] == "ServeApplicationSchema" and schema.evidence["errors"] == 4
    assert schema.evidence["fields"] == ["import_path", "applications"]
    # masumi-network/kodosumi#82: an unquoted YAML boolean in env_vars
    env = root_of(
        "TypeError: runtime_env['env_vars'] must be of type Dict[str, str], but the value False is of type <class "
        "'bool'>"
    )
    assert env.code == "LOG051" and env.evidence == {**env.evidence, "expected_type": "Dict[str, str]"}


def test_ray_memory_monitor_kills_are_memory() -> None:
    # ray-project/ray#34695 (raylet) and ray-project/ray#65847 (Serve health check)
    raylet = root_of(
        "[2023-04-19 16:22:19,798 E 329 329] (raylet) node_manager.cc:3069: 13 Workers (tasks / actors) killed due to "
        "memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 2875, IP: 10.0.10.135)"
    )
    assert (raylet.code, raylet.root_cause) == ("LOG052", RootCause.MEMORY)
    assert raylet.evidence["workers_killed"] == 13
    serve = root_of(
        "Health check for Replica(id='scdme487', deployment='ControllerBenchMetricsGenerator', app='default') failed:\n"
        "14 worker(s) were killed due to the node running low on memory. ... 28.64GB used / 30.00GB limit"
    )
    assert serve.evidence == {**serve.evidence, "workers_killed": 14, "used_gb": 28.64, "limit_gb": 30.0}


def test_tgi_launcher_limits_are_config() -> None:
    # bytedance/UI-TARS#153
    root = root_of(
        'Deployment fails with : ArgumentValidation("`max_input_tokens`(65537) must be < `max_total_tokens`(65536)")'
    )
    assert (root.code, root.root_cause) == ("LOG057", RootCause.CONFIG_INVALID)
    assert root.evidence == {**root.evidence, "max_input_tokens": 65537, "max_total_tokens": 65536}


def test_tensorrt_llm_prompt_over_the_engine_build_limit() -> None:
    # triton-inference-server/tensorrtllm_backend#141 and #565
    root = root_of("Cannot process new request: Prompt length (5056) exceeds maximum sequence length (2048)")
    assert (root.code, root.root_cause) == ("LOG058", RootCause.DYNAMIC_SHAPE_FIXED)
    assert root.evidence["prompt_tokens"] == 5056 and "--max_seq_len" in root.fix
    short = root_of(
        "Encountered an error when fetching new request: Prompt length (200) exceeds maximum input length (1)"
    )
    assert short.evidence["max_input_len"] == 1 and "--max_input_len" in short.fix


def test_optimum_export_validation_is_drift() -> None:
    # huggingface/optimum#449: optimum's validation prints each output it compared
    log = (
        "Validating ONNX model...\n"
        "        -[✓] ONNX model output names match reference model (logits)\n"
        '        - Validating ONNX Model output "logits":\n'
        "                -[✓] (2, 16, 32128) matches (2, 16, 32128)\n"
        "                -[x] values not close enough, max diff: 0.003337860107421875 (atol: 1e-05)"
    )
    root = root_of(log)
    assert (root.code, root.root_cause) == ("LOG034", RootCause.OP_SEMANTIC_DRIFT)
    assert root.evidence["max_abs_diff"] == 0.003337860107421875 and root.evidence["tolerance"] == 1e-05
    # the passing lines are not findings
    assert [f.code for f in classify_text(log, learned=False)] == ["LOG034"]


def test_the_new_signatures_do_not_fire_on_neighbouring_wordings() -> None:
    for text in (
        "INFO 03-09 17:27:20 __init__.py:207] Automatically detected platform cuda.",
        "[TensorRT-LLM][INFO] Using 132608 tokens in paged KV cache.",
        "-[✓] all values close (atol: 1e-05)",
        "Resources required for each replica: {'CPU': 1.0}, total resources available: {'CPU': 8.0}",
    ):
        assert classify_text(text, learned=False) == []


def test_triton_config_dims_tell_a_frozen_export_from_a_config_typo() -> None:
    # triton-inference-server/server#4065: the config leaves axis 1 free, the ONNX export fixed it at 256
    frozen = root_of(
        "the model expects 3 dimensions (shape [-1,256,25]) but the model configuration specifies 3 dimensions (an "
        "initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete "
        "shape [-1,-1,25])"
    )
    assert (frozen.code, frozen.root_cause) == ("LOG005", RootCause.DYNAMIC_SHAPE_FIXED)
    assert frozen.evidence["frozen_axes"] == [1] and frozen.evidence["config_shape"] == "[-1,-1,25]"
    # triton-inference-server/server#4194: 244 for 224 in config.pbtxt
    typo = root_of(
        "UNAVAILABLE: Invalid argument: model 'keypoints_pose_0', tensor 'input.1': the model expects 4 dimensions "
        "(shape [1,3,224,224]) but the model configuration specifies 4 dimensions (shape [1,3,224,244])"
    )
    assert (typo.code, typo.root_cause) == ("LOG005", RootCause.CONFIG_INVALID)
    assert "frozen_axes" not in typo.evidence and typo.message.startswith("[triton] tensor 'input.1'")
