"""usg doctor logs: rules keyed on causal vocabulary several engines share (rules_generic), the shape
checks of OpenVINO's validation, the two misfires fixed in session 8 (LOG023 off by one, LOG037 inside
ONNX Runtime's per-node status), and the root-error choice between a head line and the rule below it.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import LEARNED, classify_line, classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase
from usg.doctor.logs.similar import CaseIndex


@pytest.mark.parametrize(
    ("text", "settings"),
    [
        # sgl-project/sglang#4330
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", ["mem-fraction-static"]),
        # huggingface/text-generation-inference#755
        (
            'Error: Warmup(Generation("Not enough memory to handle 4096 prefill tokens. You need to decrease '
            '`--max-batch-prefill-tokens`"))',
            ["max-batch-prefill-tokens"],
        ),
        # LMCache/LMCache#745
        (
            "Failed to allocate memory for tensor(torch.Size([2, 80, 256, 256]), torch.float16) because no memory is "
            "available (memory_management.py:444:lmcache.experimental.memory_management)",
            None,
        ),
    ],
)
def test_memory_stated_in_words_is_memory(text: str, settings: list[str] | None) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG059", RootCause.MEMORY)
    assert root.evidence.get("settings_named") == settings


def test_memory_wording_reads_the_quantities() -> None:
    # huggingface/text-generation-inference#755
    root = root_of(
        'Error: Warmup(Generation("Not enough memory to handle 4096 prefill tokens. You need to decrease '
        '`--max-batch-prefill-tokens`"))'
    )
    assert root.evidence["quantities"] == ["4096 prefill tokens"]


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        # pytorch/pytorch#153955
        (
            "torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode: Could not guard on data-dependent "
            "expression Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: none)",
            "Eq(u0, 1)",
        ),
        # pytorch/pytorch#143222
        (
            "torch.onnx.export fails with <class 'torch._dynamo.exc.UserError'>: Could not guard on data-dependent "
            "expression u1 < 0 (unhinted: u1 < 0). (Size-like symbols: none)",
            "u1 < 0",
        ),
    ],
)
def test_data_dependent_guard_is_a_shape_the_exporter_cannot_keep_dynamic(text: str, expression: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG060", RootCause.DYNAMIC_SHAPE_FIXED)
    assert root.evidence["expression"] == expression and "torch._check" in root.fix


def test_model_file_that_cannot_be_opened_is_the_configured_path() -> None:
    # linghu8812/tensorrt_inference#163
    root = root_of(
        "Could not open file ../weights/hrnet_w48_coco_256x192.onnx\n"
        "Could not open file ../weights/hrnet_w48_coco_256x192.onnx\n"
        "Failed to parse ONNX model from file../weights/hrnet_w48_coco_256x192.onnx"
    )
    assert (root.code, root.root_cause) == ("LOG061", RootCause.CONFIG_INVALID)
    assert root.evidence["path"] == "../weights/hrnet_w48_coco_256x192.onnx"
    # microsoft/onnxruntime#24691
    ort = root_of(
        "onnxruntime.capi.onnxruntime_pybind11_state.NoSuchFile: [ONNXRuntimeError] : 3 : NO_SUCHFILE : Load model "
        "from model.onnx failed:Load model model.onnx failed. File doesn't exist"
    )
    assert ort.root_cause is RootCause.CONFIG_INVALID


def test_model_read_as_text_is_not_a_model_file() -> None:
    # NVIDIA/TensorRT#1589
    root = root_of(
        "[libprotobuf ERROR google/protobuf/text_format.cc:298] Error parsing text-format onnx2trt_onnx.ModelProto: "
        "1:9: Message type \u201connx2trt_onnx.ModelProto\u201d has no field named \u201connx\u201d."
    )
    assert (root.code, root.root_cause) == ("LOG061", RootCause.CONFIG_INVALID)
    assert root.evidence["proto"] == "onnx2trt_onnx.ModelProto" and "not a binary model" in root.message


def test_shared_library_that_cannot_be_opened_stays_an_environment_problem() -> None:
    # commaai/openpilot#31708: "cannot open shared object file: No such file or directory"
    root = root_of(
        "2024-03-05 11:40:14.847702004 [E:onnxruntime:Default, provider_bridge_ort.cc:1548 TryGetProviderInfo_CUDA] "
        "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:1209 onnxruntime::Provider& "
        "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
        "libonnxruntime_providers_cuda.so with error: libcublasLt.so.11: cannot open shared object file: No such "
        "file or directory"
    )
    assert root.code != "LOG061" and root.root_cause is RootCause.ENVIRONMENT


def test_gpu_architecture_a_kernel_lacks_is_environment() -> None:
    # NVIDIA/TensorRT-LLM#1515
    root = root_of(
        "Assertion failed: Unsupported architecture (/tensorrt_llm/cpp/tensorrt_llm/kernels/"
        "contextFusedMultiHeadAttention/fmhaRunner.cpp:89)"
    )
    assert (root.code, root.root_cause) == ("LOG062", RootCause.ENVIRONMENT)
    assert root.evidence["kernel"] == "fmhaRunner.cpp"


def test_model_architecture_unsupported_is_not_a_gpu_problem() -> None:
    # huggingface/optimum#1713: a model architecture, not a GPU's
    f = classify_line(
        "ValueError: Trying to export a owlv2 model, that is a custom or unsupported architecture, but no custom onnx "
        "configuration was passed as `custom_onnx_configs`."
    )
    assert f is None or f.code != "LOG062"


def test_tensorflow_graph_from_a_newer_tensorflow_is_version_coupling() -> None:
    # openvinotoolkit/openvino#4580
    root = root_of(
        "[ ERROR ]  NodeDef mentions attr 'exponential_avg_factor' not in Op<name=FusedBatchNormV3; signature=x:T, "
        "scale:U, offset:U, mean:U, variance:U -> y:T, batch_mean:U, batch_variance:U>;"
    )
    assert (root.code, root.root_cause) == ("LOG063", RootCause.VERSION_COUPLING)
    assert (root.evidence["attribute"], root.evidence["op"]) == ("exponential_avg_factor", "FusedBatchNormV3")


@pytest.mark.parametrize(
    "text",
    [
        # openvinotoolkit/openvino#8540
        "terminate called after throwing an instance of 'ngraph::NodeValidationFailure'\n"
        "  what():  Check 'PartialShape::broadcast_merge_into( pshape, node->get_input_partial_shape(i), autob)' "
        "failed at core/src/op/util/elementwise_args.cpp:40:\n"
        "While validating node 'v1::Multiply Multiply_984 (inpaint_net/Reshape_8/Transpose[0]:f32{1,1024,32,32}, "
        "inpaint_net/Cast[0]:f32{1,3,1,1}) -> ()' with friendly_name 'Multiply_984':\n"
        "Argument shapes are inconsistent.",
        # luxonis/blobconverter#23
        "Check 'backward_compatible_check || in_out_elements_equal' failed at core/src/op/reshape.cpp:395:\n"
        "While validating node 'v1::Reshape Reshape_145 (LeakyRelu_143[0]:f32{1,256,4,2}, Constant_144[0]:i64{6}) -> "
        "(f32{?,?,?,?,?,?})' with friendly_name 'Reshape_145':\n"
        "Requested output shape {4,256,4,1,2,1} is incompatible with input shape Shape{1, 256, 4, 2}",
    ],
)
def test_openvino_shape_checks_are_shape_problems(text: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG035", RootCause.SHAPE_OR_RANK)
    assert "component" in root.evidence


def test_openvino_other_validation_checks_stay_with_known_cases() -> None:
    # openvinotoolkit/openvino#15084 (thread: a version issue): a rank check names no shape relation
    f = classify_line(
        "[ ERROR ]  Check 'i < input_pshape.rank().get_length()' failed at C:\\j\\workspace\\openvino\\src\\core\\"
        "shape_inference\\include\\gather_shape_inference.hpp:34:"
    )
    assert f is None or f.code != "LOG035" or f.root_cause is not RootCause.SHAPE_OR_RANK


def test_image_tokens_off_by_one_below_a_square_grid_is_a_prompt_setting() -> None:
    # huggingface/transformers#36054: 575 tokens for 576 patches (hand-built prompt after fine-tuning)
    f = classify_line("ValueError: Image features and image tokens do not match: tokens: 575, features 576")
    assert f is not None and f.code == "LOG023" and f.root_cause is RootCause.CONFIG_INVALID
    assert "apply_chat_template" in f.fix
    # huggingface/transformers#36002: one token for 297 features is the processor's legacy path
    legacy = classify_line("ValueError: Image features and image tokens do not match: tokens: 1, features 297")
    assert legacy is not None and legacy.root_cause is RootCause.VERSION_COUPLING


def test_bad_allocation_inside_an_onnxruntime_node_status_is_not_called_memory() -> None:
    # AIDajiangtang/Segment-Anything-CSharp#1: the thread's cause was a model/runtime version mismatch
    line = (
        "'[ErrorCode:RuntimeException] Non-zero status code returned while running Add node. "
        "Name:'/blocks.7/attn/Add_2' Status Message: bad allocation'"
    )
    f = classify_line(line)
    assert f is None or f.code != "LOG037"
    # bes-dev/stable_diffusion.openvino#132: compiling the UNet runs out of host memory
    compiled = classify_line("RuntimeError: std::bad_alloc")
    assert compiled is not None and (compiled.code, compiled.root_cause) == ("LOG037", RootCause.MEMORY)


def _index() -> CaseIndex:
    def case(n: int, cause: RootCause, text: str) -> LabelledCase:
        return LabelledCase(f"https://github.com/o/r/issues/{n}", "p", cause, "r", False, text)

    return CaseIndex(
        [
            case(1, RootCause.VERSION_COUPLING, "ERROR: ModelImporter.cpp:134 In function parseGraph: version"),
            case(2, RootCause.VERSION_COUPLING, "ERROR: ModelImporter.cpp:92 In function parseGraph: opset version"),
            case(3, RootCause.MEMORY, "CUDA out of memory"),
        ]
    )


def test_rule_below_a_learned_head_line_is_the_root_error() -> None:
    # onnx/onnx-tensorrt#465: the head line says where, the next line what
    text = (
        'While parsing node number 2 [Mish -> "001_convolutional_mish"]:\n'
        "ERROR: /home/ashing/onnx-tensorrt/ModelImporter.cpp:134 In function parseGraph:\n"
        "[8] No importer registered for op: Mish"
    )
    found = classify_text(text, "trt.log", index=_index())
    head = [f for f in found if f.location.line == 2]
    assert head and head[0].code == LEARNED.code  # the learned layer guessed from the head line alone
    root = root_error(found)
    assert root is not None and (root.code, root.root_cause) == ("LOG019", RootCause.UNSUPPORTED_OP)
    assert root.evidence["op"] == "Mish"


def test_learned_root_stays_when_no_rule_follows_closely() -> None:
    text = "ERROR: /x/ModelImporter.cpp:134 In function parseGraph:\n" + "\n".join(
        f"I1203 10:00:0{i} info line {i}" for i in range(8)
    )
    text += "\n[8] No importer registered for op: Mish"
    root = root_error(classify_text(text, "trt.log", index=_index()))
    assert root is not None and root.code == LEARNED.code
