"""usg doctor logs: what a run asks of the machine and of the files it loads (session 21, rules_resources.py and two
readings widened) — "out of memory" in any engine's words (LOG059), more GPUs or placement groups than the cluster
holds (LOG110), a precision the GPU's hardware lacks (LOG111), a pickled class the loading program does not have
(LOG112: the saving script's own class, or a library class of another release), an optimization profile over an axis
the network fixes (LOG113), a truncated torch checkpoint (LOG105).

Each rule is tested on phrasings other than the corpus entries it came from (other engines, error codes, sizes,
classes, modules) and on near misses it must leave alone."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error


def _root_code(text: str) -> str | None:
    root = root_error(classify_text(text, "pasted.log", learned=False))
    return None if root is None else root.code


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
        "API call, so the stacktrace below might be incorrect.",
        "torch.OutOfMemoryError: CUDA out of memory",
        "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMalloc(ptr, n): out of memory "
        "(/src/cpp/tensorrt_llm/runtime/bufferManager.cpp:88)",
        "[12/01/2024-10:00:00] [TRT] [E] 1: [defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime "
        "(cudaErrorMemoryAllocation: out of memory)",
        "[01/02/2025-11:22:33] [TRT] [E] 2: [executionContext.cpp::ExecutionContext::563] Error Code 2: OutOfMemory "
        "(Requested size was 4294967296 bytes.)",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "8589934592 bytes.",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[64,512,512] and type float on /job:localhost/replica:0/task:0/device:GPU:0",
        "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY",
        'Generation("Allocation on device 1 would exceed allowed memory. (out of memory)\\nCurrently allocated : '
        '22.1 GiB")',
    ],
)
def test_out_of_memory_in_any_engine_words(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG059", RootCause.MEMORY)


def test_out_of_memory_advice_at_start_up_is_not_an_error() -> None:
    log = (
        "INFO 05-02 10:00:01 model_runner.py:1025] CUDA graphs can take additional 1~3 GiB memory per GPU. If you "
        "are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.\n"
        "ValueError: Unknown quantization method: gptq_marlin. Must be one of ['awq', 'gptq', 'squeezellm']."
    )
    root = root_of(log)
    assert root.code == "LOG097"
    assert "LOG059" not in {f.code for f in classify_text(log, "pasted.log", learned=False)}


def test_an_earlier_engine_rule_keeps_its_reading_of_memory() -> None:
    root = root_of("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.77 GiB)")
    assert root.code == "LOG012"


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "ray.serve.exceptions.RayServeException: ValueError: Not enough resources to allocate 4 placement groups, "
            "only created 2 placement groups.",
            "placement_groups",
            4,
        ),
        (
            "ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement "
            "group. Required: 8, available: 4",
            "placement",
            "GPUs",
        ),
        (
            "RuntimeError: Ray does not allocate any GPUs on the driver node. Consider adjusting the Ray placement "
            "group or running the driver on a GPU node.",
            "placement",
            "driver node without GPUs",
        ),
    ],
)
def test_more_gpus_or_bundles_than_the_cluster_holds(text: str, key: str, value: object) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG110", RootCause.CONFIG_INVALID)
    assert root.evidence[key] == value


@pytest.mark.parametrize(
    ("text", "feature"),
    [
        (
            "[TRT] [E] 9: [standardEngineBuilder.cpp::buildEngine::2266] Error Code 9: Internal Error (Networks with "
            "FP4 precision require hardware with FP4 support.)",
            "FP4",
        ),
        ("RuntimeError: FP8 is not supported on this GPU type (compute capability 8.0)", "FP8"),
        ("ValueError: The current device does not support bfloat16; use float16 instead", "bfloat16"),
        ("AssertionError: NVFP4 GEMM requires a GPU with NVFP4 support (Blackwell)", "NVFP4"),
    ],
)
def test_a_precision_the_gpu_hardware_lacks(text: str, feature: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG111", RootCause.ENVIRONMENT)
    assert root.evidence["feature"] == feature


def test_an_op_not_supported_on_a_device_is_not_a_hardware_precision() -> None:
    assert _root_code("RuntimeError: Operation Softmax is not supported on this device (NPU)") != "LOG111"


def test_pickled_class_of_the_saving_script() -> None:
    root = root_of(
        '  File "/opt/venv/lib/python3.10/site-packages/torch/serialization.py", line 1025, in load\n'
        "    return _legacy_load(opened_file, map_location, pickle_module, **pickle_load_args)\n"
        "AttributeError: Can't get attribute 'AverageMeter' on <module '__main__' from 'evaluate.py'>"
    )
    assert (root.code, root.root_cause) == ("LOG112", RootCause.ENVIRONMENT)
    assert root.evidence["class"] == "AverageMeter"
    assert "import" in root.fix


@pytest.mark.parametrize(
    ("text", "module"),
    [
        (
            "AttributeError: Can't get attribute 'SiLU' on <module 'torch.nn.modules.activation' from "
            "'/usr/lib/python3/dist-packages/torch/nn/modules/activation.py'>",
            "torch.nn.modules.activation",
        ),
        (
            "AttributeError: Can't get attribute '_unpickle_block' on <module 'pandas._libs.internals' from "
            "'/env/lib/python3.9/site-packages/pandas/_libs/internals.cpython-39-x86_64-linux-gnu.so'>",
            "pandas._libs.internals",
        ),
    ],
)
def test_pickled_class_a_library_release_does_not_have(text: str, module: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG112", RootCause.VERSION_COUPLING)
    assert root.evidence["module"] == module


def test_profile_over_an_axis_the_network_fixes() -> None:
    root = root_of(
        "[12/02/2025-09:10:11] [E] Error[4]: IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error "
        "(Dimension mismatch for tensor images and profile 0. At dimension axis 0, profile has min=1, opt=4, max=16 "
        "but tensor has 1. In validate at optimizer/api/builder.cpp:1212)"
    )
    assert (root.code, root.root_cause) == ("LOG113", RootCause.DYNAMIC_SHAPE_FIXED)
    assert (root.evidence["tensor"], root.evidence["axis"], root.evidence["fixed"]) == ("images", 0, 1)
    assert root.evidence["profile"] == [1, 4, 16]


def test_truncated_torch_checkpoint() -> None:
    root = root_of("RuntimeError: storage has wrong size: expected 2359296 got 1048576")
    assert (root.code, root.root_cause) == ("LOG105", RootCause.CONFIG_INVALID)
    assert "2359296" in root.evidence["file_check"]


def test_triton_dtype_mismatch_of_an_inference_input() -> None:
    root = root_of(
        "tritonclient.utils.InferenceServerException: [StatusCode.INVALID_ARGUMENT] [request id: <id_unknown>] "
        "unexpected datatype TYPE_INT64 for inference input 'input_ids', expecting TYPE_INT32"
    )
    assert (root.code, root.root_cause) == ("LOG002", RootCause.DTYPE_OR_RANGE)
    assert (root.evidence["input"], root.evidence["got"]) == ("input_ids", "TYPE_INT64")


def test_onnxruntime_dimensions_quoted_in_markdown() -> None:
    root = root_of(
        "> [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: pixel_values for the "
        "following indices\n>  index: 0 Got: 4 Expected: 1\n>  Please fix either the inputs or the model."
    )
    assert (root.code, root.root_cause) == ("LOG006", RootCause.DYNAMIC_SHAPE_FIXED)
    assert root.evidence["got"] == 4


def test_samples_sent_without_their_batch_axis_are_not_a_frozen_batch() -> None:
    root = root_of(
        "INVALID_ARGUMENT : Got invalid dimensions for input: audio for the following indices\n"
        " index: 0 Got: 480000 Expected: 1\n Please fix either the inputs or the model."
    )
    assert (root.code, root.root_cause) == ("LOG006", RootCause.SHAPE_OR_RANK)


@pytest.mark.parametrize(
    "text",
    [
        "INVALID_ARGUMENT : Unexpected input data type.Actual: (tensor(int64)) , expected: (tensor(int32))",
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Unexpected input data type. Actual: (tensor(double)) , "
        "expected: (tensor(flo",
    ],
)
def test_onnxruntime_input_dtype_without_a_space_or_cut_off(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG007", RootCause.DTYPE_OR_RANGE)


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "onnxruntime.capi.onnxruntime_pybind11_state.InvalidGraph: [ONNXRuntimeError] : 10 : INVALID_GRAPH : Load "
            "model from encoder.onnx failed:This is an invalid model. Type Error: Type 'tensor(int64)' of input "
            "parameter (axes) of operator (ReduceSum) in node (/ReduceSum_3) is invalid.",
            "operator",
            "ReduceSum",
        ),
        (
            "Microsoft.ML.OnnxRuntime.OnnxRuntimeException: [ErrorCode:Fail] Type Error: Type parameter (T) of Optype "
            "(MatMul) bound to different types (tensor(float16) and tensor(float) in node (/lm_head/MatMul).",
            "types",
            ["tensor(float16)", "tensor(float)"],
        ),
        (
            "failed to load 'classifier' version 1: Internal: onnx runtime error 1: Load model from "
            "/models/classifier/1/model.onnx failed:Type Error: Type (tensor(int32)) of output arg (labels) of node "
            "(ArgMax_12) does not match expected type (tensor(int64)).",
            "expected",
            "tensor(int64)",
        ),
    ],
)
def test_onnx_type_check_of_an_operator_input(text: str, key: str, value: object) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG114", RootCause.DTYPE_OR_RANGE)
    assert root.evidence[key] == value
    assert "Cast" in root.fix


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (
            "onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT "
            ": Failed to load model with error: Unknown model file format version.",
            "format",
            "model file format version",
        ),
        (
            "Exception: data did not match any variant of untagged enum ModelWrapper at line 250373 column 3",
            "tokenizers_type",
            "ModelWrapper",
        ),
        (
            "ValueError: This ORT build has ['CUDAExecutionProvider', 'CPUExecutionProvider'] enabled. Since ORT 1.9, "
            "you are required to explicitly set the providers parameter when instantiating InferenceSession.",
            "since",
            "1.9",
        ),
        (
            "ValueError: Currently, Phi3V only supports versions 3.0, 3.5. Got version: (4, 0)",
            "supported_versions",
            "3.0, 3.5",
        ),
    ],
)
def test_a_version_the_installed_release_does_not_know(text: str, key: str, value: object) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG115", RootCause.VERSION_COUPLING)
    assert root.evidence[key] == value


def test_tensorrt_version_tag_without_the_versions() -> None:
    root = root_of(
        "[TensorRT] ERROR: coreReadArchive.cpp (31) - Serialization Error in verifyHeader: 0 (Version tag does not "
        "match)\n[TensorRT] ERROR: INVALID_STATE: std::exception"
    )
    assert (root.code, root.root_cause) == ("LOG038", RootCause.VERSION_COUPLING)


def test_dynamic_network_without_an_optimization_profile() -> None:
    root = root_of(
        "[12/03/2025-08:00:00] [TRT] [E] 4: Network has dynamic or shape inputs, but no optimization profile has been "
        "defined.\n[12/03/2025-08:00:00] [TRT] [E] 4: [network.cpp::validate::2965] Error Code 4: Internal Error "
        "(Network must have at least one output)"
    )
    assert (root.code, root.root_cause) == ("LOG116", RootCause.DYNAMIC_SHAPE_FIXED)
    assert "--minShapes" in root.fix


def test_installed_version_below_the_minimum_in_other_words() -> None:
    root = root_of(
        "Exception: sgl_kernel_python is installed with version 0.1.9, which is less than the minimum required "
        "version 0.2.4. Please reinstall the latest version with `pip install sgl-kernel --force-reinstall`"
    )
    assert (root.code, root.root_cause) == ("LOG082", RootCause.VERSION_COUPLING)
    assert (root.evidence["package"], root.evidence["installed"], root.evidence["minimum"]) == (
        "sgl_kernel_python",
        "0.1.9",
        "0.2.4",
    )


def test_a_python_interpreter_minimum_is_not_a_package() -> None:
    assert _root_code("RuntimeError: Python >= 3.10 is required, but found 3.8.10") != "LOG082"


@pytest.mark.parametrize(
    ("text", "name", "cause"),
    [
        (
            "RuntimeError: \nUnknown builtin op: aten::scaled_dot_product_attention.\nHere are some suggestions: \n"
            "\taten::_scaled_dot_product_attention",
            "aten::scaled_dot_product_attention",
            RootCause.VERSION_COUPLING,
        ),
        (
            "failed to load 'encoder' version 1: Internal: load failed for libtorch model -> 'encoder: \nUnknown type "
            "name 'Optional[Tensor]':\nSerialized   File \"code/__torch__/model.py\", line 9",
            "Optional",
            RootCause.VERSION_COUPLING,
        ),
        (
            "RuntimeError: \nUnknown builtin op: torchvision::nms.\nCould not find any similar ops",
            "torchvision::nms",
            RootCause.ENVIRONMENT,
        ),
        (
            "Unknown type name '__torch__.torch.classes.tokenizers.Vocab':",
            "__torch__.torch.classes.tokenizers.Vocab",
            RootCause.ENVIRONMENT,
        ),
    ],
)
def test_torchscript_type_or_op_the_runtime_does_not_know(text: str, name: str, cause: RootCause) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause, root.evidence["name"]) == ("LOG117", cause, name)


def test_a_c_compiler_unknown_type_is_not_torchscript() -> None:
    assert _root_code("main.c:3:1: error: unknown type name 'uint8_t'") != "LOG117"
