"""usg doctor logs: message families that state their cause without a version or a number — a library API one
side has and the other lacks (a module attribute, a keyword, an argument count, a C++ member), a local file
shadowing a package (circular import), a Ray runtime_env that cannot be set up, an OpenVINO model no frontend
reads, a device plugin that cannot be created.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.features import vocab_vector


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        # DengpanFu/LUPerson#5 (onnx.optimizer left onnx in 1.9)
        ("AttributeError: module 'onnx' has no attribute 'optimizer'", {"module": "onnx", "name": "optimizer"}),
        # huggingface/optimum#1901 (an onnxruntime release whose quantizer lacks the keyword optimum passes)
        (
            "TypeError: QDQQuantizer.__init__() got an unexpected keyword argument 'static'",
            {"function": "QDQQuantizer.__init__", "keyword": "static"},
        ),
        # NVIDIA/TensorRT-LLM#2469 (TensorRT-LLM sources built against an older TensorRT)
        (
            "/home/work/xingwuFileSystem/qserve_trtllm/TensorRT-LLM/cpp/tensorrt_llm/runtime/tllmRuntime.cpp:113:16: "
            "error: ‘class nvinfer1::ICudaEngine’ has no member named ‘setWeightStreamingBudgetV2’; did you mean "
            "‘setWeightStreamingBudget’?",
            {"member": "setWeightStreamingBudgetV2"},
        ),
    ],
)
def test_api_of_another_release_is_version_coupling(text: str, evidence: dict[str, str]) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG066", RootCause.VERSION_COUPLING)
    assert evidence.items() <= root.evidence.items()
    assert "different releases" in root.message and "pin" in root.fix


def test_api_mismatch_wording_is_not_read_on_builtins_or_none() -> None:
    # sgl-project/sglang#165: the cause (out of memory) is only in the discussion
    assert root_of("AttributeError: 'NoneType' object has no attribute 'cpu'").code != "LOG066"
    assert root_of("TypeError: dict.get() got an unexpected keyword argument 'default'").code != "LOG066"
    assert vocab_vector("AttributeError: 'NoneType' object has no attribute 'cpu'")[-1] == 0.0  # the "api" group
    assert vocab_vector("AttributeError: module 'onnx' has no attribute 'optimizer'")[-1] > 0


def test_partially_initialised_module_is_a_local_file_shadowing_the_package() -> None:
    # huggingface/optimum#739: "100% my bad I had a file called onnx"
    text = (
        "RuntimeError: Failed to import optimum.onnxruntime.modeling_ort because of the following error (look up to "
        "see its traceback):\ncannot import name 'export_models' from partially initialized module "
        "'optimum.exporters.onnx' (most likely due to a circular import) "
        "(/usr/local/lib/python3.8/dist-packages/optimum/exporters/onnx/__init__.py)"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG043", RootCause.ENVIRONMENT)
    assert {"name": "export_models", "module": "optimum.exporters.onnx"}.items() <= root.evidence.items()
    assert "rename the local" in root.fix


def test_cannot_import_name_from_an_initialised_module_stays_a_release_mismatch() -> None:
    # a name the installed release lacks (the importer was written for another one)
    root = root_of("ImportError: cannot import name 'is_torch_less_than_1_11' from 'transformers.pytorch_utils'")
    assert (root.code, root.root_cause) == ("LOG043", RootCause.VERSION_COUPLING)


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        # ray-project/ray#20483: working_dir is not a URI Ray can fetch
        (
            "(raylet) [2021-11-17 10:43:46,668 E 99870 16327337] agent_manager.cc:190: Failed to create runtime env: "
            '{"working_dir": "s3://fake.zip"}, error message: not enough values to unpack (expected 2, got 1)',
            ["working_dir"],
        ),
        # ray-project/ray#26205: a bad runtime_env key in the deployed config
        (
            "ray.exceptions.RuntimeEnvSetupError: Failed to setup runtime environment.\n"
            "ray::ServeController.get_serve_status() (pid=40678, ip=127.0.0.1, repr=<ray.serve.controller."
            "ServeController object at 0x10db66520>)",
            None,
        ),
    ],
)
def test_runtime_env_that_cannot_be_set_up_is_a_config_error(text: str, fields: list[str] | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG067", RootCause.CONFIG_INVALID)
    assert root.evidence.get("fields") == fields
    assert "runtime_env" in root.fix


def test_openvino_unreadable_model_with_frontends_is_the_file() -> None:
    # blakeblackshear/frigate#12304: the model path did not exist
    text = (
        "Unable to read the model: /invalid_path.xml Please check that model format: xml is supported and the "
        "model is correct. Available frontends: tf onnx ir tflite paddle pytorch"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG068", RootCause.CONFIG_INVALID)
    assert root.evidence["path"] == "/invalid_path.xml"
    assert root.evidence["frontends"] == ["tf", "onnx", "ir", "tflite", "paddle", "pytorch"]


def test_openvino_unreadable_model_without_any_frontend_is_the_install() -> None:
    # openvinotoolkit/openvino#21296: the IR frontend library was not deployed with the Android build
    text = (
        "InferenceEngine::NetworkNotRead: [ NETWORK_NOT_READ ] Unable to read the model: xml Please check that "
        "model format: xml is supported and the model is correct. Available frontends:"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG068", RootCause.ENVIRONMENT)
    assert root.evidence["frontends"] == []
    assert "frontend libraries" in root.fix


def test_openvino_device_plugin_that_cannot_be_created_is_the_environment() -> None:
    # dlstreamer/pipeline-server#108: the container's GPU runtime did not support the new GPU
    text = (
        "Failed to construct OpenVINOImageInference\n\tFailed to create plugin "
        "/opt/intel/openvino/deployment_tools/inference_engine/lib/intel64/libclDNNPlugin.so for device GPU\n"
        "Please, check your environment\n[CLDNN ERROR]. clGetPlatformIDs error -1001\n"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG069", RootCause.ENVIRONMENT)
    assert root.evidence["device"] == "GPU"
    assert root.evidence["plugin"].endswith("libclDNNPlugin.so")
    assert "driver" in root.message and "run on CPU" in root.fix


def test_trtllm_plugin_field_layout_is_an_engine_of_another_release() -> None:
    # triton-inference-server/tensorrtllm_backend#300: engine and backend from different TensorRT-LLM versions
    text = (
        "[TensorRT-LLM][ERROR] tensorrt_llm::common::TllmException: [TensorRT-LLM][ERROR] Assertion failed: "
        "d == a + length (/app/tensorrt_llm/cpp/tensorrt_llm/plugins/gptAttentionCommon/gptAttentionCommon.cpp:418)"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG070", RootCause.VERSION_COUPLING)
    assert root.evidence["plugin"] == "gptAttentionCommon"
    assert "rebuild the engine" in root.fix


@pytest.mark.parametrize(
    "text",
    [
        # huggingface/text-generation-inference#1627 (the CPU lacks an instruction set the kernels use)
        "2024-03-06T17:53:31.052444Z ERROR shard-manager: text_generation_launcher: Shard process was signaled to "
        "shutdown with signal 4 rank=0\nError: ShardCannotStart",
        # huggingface/text-generation-inference#2238
        "Shard process was signaled to shutdown with signal 4 rank=0 Error: ShardCannotStart",
    ],
)
def test_illegal_instruction_is_the_host_cpu(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG071", RootCause.ENVIRONMENT)
    assert "AVX" in root.message


@pytest.mark.parametrize(
    "text",
    [
        # onnx/onnx#2963 (beam_size.item() froze the beam size)
        "TracerWarning: Converting a tensor to a Python number might cause the trace to be incorrect. We can't "
        "record the data flow of Python values, so this value will be treated as a constant in the future.",
        # open-edge-platform/geti#3770
        "> /mnt/d/Projects/venv/lib/python3.10/site-packages/otx/core/model/detection.py:275: TracerWarning: Using "
        "len to get tensor shape might cause the trace to be incorrect. Recommended usage would be tensor.shape[0].",
    ],
)
def test_every_tracer_freeze_wording_is_a_frozen_shape(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG014", RootCause.DYNAMIC_SHAPE_FIXED)
