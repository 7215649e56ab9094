"""usg doctor logs: messages whose cause the message itself does not state stay unclassified (TensorRT's
"no implementation for node", a bare KeyError/AttributeError), Triton's own wording is not read as a cause
(the tensor names a config gives, the model's version directory), and a build's consequence lines are not
causes.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest

from usg.doctor.findings import Location, RootCause, Stage
from usg.doctor.logs.classify import LEARNED, classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase
from usg.doctor.logs.features import features_text, vocab_vector
from usg.doctor.logs.similar import CaseIndex
from usg.doctor.registry import finding

# NVIDIA/TensorRT#2918: the maintainer's answer was an old driver (455), not a missing kernel
NO_TACTIC_DRIVER = (
    "E] Error[10]: [optimizer.cpp::computeCosts::3728] Error Code 10: Internal Error (Could not find any "
    "implementation for node {ForeignNode[177...Reshape_81 + (Unnamed Layer* 146) [Shuffle]]}.)\n"
    "[04/28/2023-14:06:47] [E] Error[2]: [builder.cpp::buildSerializedNetwork::751] Error Code 2: Internal Error "
    "(Assertion engine != nullptr failed. )"
)


def _index() -> CaseIndex:
    def case(n: int, cause: RootCause, text: str) -> LabelledCase:
        return LabelledCase(f"https://github.com/o/r/issues/{n}", "p", cause, "r", False, text)

    return CaseIndex(
        [
            case(1, RootCause.VERSION_COUPLING, "Error Code 2: Internal Error (Assertion engine failed) version"),
            case(2, RootCause.ENVIRONMENT, "[E] Error[2]: builder.cpp Internal Error driver"),
            case(3, RootCause.UNSUPPORTED_OP, "AttributeError: 'Config' object has no attribute 'x' not supported"),
            case(4, RootCause.MEMORY, "CUDA out of memory"),
        ]
    )


def test_no_tactic_for_a_node_does_not_claim_a_cause_the_message_does_not_state() -> None:
    # NVIDIA/TensorRT#3423 (fixed by a newer driver and TensorRT, per the maintainer)
    text = (
        "Error Code 10: Internal Error (Could not find any implementation for node {ForeignNode[(Unnamed Layer* "
        "2176) [Shuffle]...p2o.Slice.111]}.)"
    )
    root = root_error(classify_text(text, "trt.log", learned=False))
    assert root is not None and root.code == "LOG016"
    assert root.root_cause is RootCause.UNCLASSIFIED
    assert root.evidence["possible_causes"] == ["memory", "version_coupling", "unsupported_op"]
    assert "driver" in root.fix and "workspace" in root.fix


def test_no_tactic_beside_a_workspace_hint_is_memory() -> None:
    # NVIDIA/TensorRT#477: the 1080 Ti ran out of memory while timing tactics
    text = (
        "[03/07/2020-16:57:34] [E] [TRT] Internal error: could not find any implementation for node \n"
        "conv0_fwd, try increasing the workspace size with IBuilder::setMaxWorkspaceSize()"
    )
    root = root_error(classify_text(text, "trt.log", learned=False))
    assert root is not None and (root.code, root.root_cause) == ("LOG016", RootCause.MEMORY)


def test_a_guess_about_the_lines_after_an_unclassified_rule_finding_is_not_the_root() -> None:
    found = classify_text(NO_TACTIC_DRIVER, "trt.log", index=_index())
    root = root_error(found)
    assert root is not None and root.code == "LOG016" and root.root_cause is RootCause.UNCLASSIFIED
    assert all(f.code != LEARNED.code for f in found)  # the assertion below it is the build's consequence
    assert [f.code for f in found] == ["LOG016", "LOG028"]


def _unclassified(line: int, text: str):
    return finding(
        "LOG000",
        f"unclassified error: {text}",
        Location("npu.log", line=line),
        "read the log",
        {"line_text": text},
        stage=Stage.LOGS,
    )


def _guess(line: int, text: str, cause: RootCause):
    return finding(
        LEARNED,
        text,
        Location("npu.log", line=line),
        "see the known cases",
        {"line_text": text},
        stage=Stage.LOGS,
        root_cause=cause,
    )


def test_a_guess_about_the_line_after_an_unclassified_error_is_not_the_root() -> None:
    # openvinotoolkit/openvino#22846: the NPU compiler's error, then the plugin's consequence line
    compile_error = _unclassified(
        2, "LevelZeroCompilerInDriver: Failed to compile network. Error code: 2147483646. Compilation failed"
    )
    after = _guess(3, 'Failed to create executable"', RootCause.ENVIRONMENT)
    assert root_error([compile_error, after]) is compile_error
    # a guess on the line before it is not about its consequence
    before = _guess(1, "Failed to create plugin for device NPU", RootCause.ENVIRONMENT)
    assert root_error([before, compile_error]) is before


def test_a_head_line_ending_in_a_colon_does_not_hide_the_line_below() -> None:
    # onnx/onnx-tensorrt#414: the head says where, the line below what
    head = _unclassified(1, "ERROR: ModelImporter.cpp:124 In function parseGraph:")
    below = _guess(2, "[5] Assertion failed: ctx->tensors().count(inputName)", RootCause.VERSION_COUPLING)
    assert root_error([head, below]) is below


@pytest.mark.parametrize(
    ("text", "kind", "name", "allowed", "model"),
    [
        # triton-inference-server/server#4767
        (
            "E0815 07:00:04.655657 90 model_repository_manager.cc:1348] failed to load 'sts' version 1: Invalid "
            "argument: unexpected inference output 'model_output', allowed outputs are: logits",
            "output",
            "model_output",
            ["logits"],
            "sts",
        ),
        # triton-inference-server/tutorials#137
        (
            "failed to load 'text_recognition' version 1: Invalid argument: unexpected inference output '308', "
            "allowed outputs are: 307",
            "output",
            "308",
            ["307"],
            "text_recognition",
        ),
        # isarsoft/yolov4-triton-tensorrt#54 (a table row of the start-up log)
        (
            "| yolov4           | 1       | UNAVAILABLE: Invalid argument: unexpected inference input 'data', "
            "allowed inputs are: input |",
            "input",
            "data",
            ["input"],
            None,
        ),
    ],
)
def test_triton_tensor_name_the_model_lacks_is_a_config_error(
    text: str, kind: str, name: str, allowed: list[str], model: str | None
) -> None:
    root = root_error(classify_text(text, "triton.log", learned=False))
    assert root is not None and (root.code, root.root_cause) == ("LOG064", RootCause.CONFIG_INVALID)
    assert (root.evidence["kind"], root.evidence["name"], root.evidence["allowed"]) == (kind, name, allowed)
    assert root.evidence.get("model") == model
    assert f"rename the {kind} in config.pbtxt" in root.fix


def test_triton_model_without_version_directory_is_a_config_error() -> None:
    # triton-inference-server/server#2681
    text = (
        "I0331 08:02:31.757406 1 autofill.cc:138] TensorFlow SavedModel autofill: Internal: unable to autofill for "
        "'identity' due to no version directories"
    )
    root = root_error(classify_text(text, "triton.log", learned=False))
    assert root is not None and (root.code, root.root_cause) == ("LOG065", RootCause.CONFIG_INVALID)
    assert root.evidence["model"] == "identity" and "identity/1/model.onnx" in root.fix


def test_triton_model_version_is_not_version_vocabulary() -> None:
    # triton-inference-server/tensorrtllm_backend#710: "version 1" is the model's directory, not a release
    text = (
        "E0218 20:57:33.147956 130 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm_2beam' version 1: "
        "Internal: unexpected error when creating modelInstanceState"
    )
    assert vocab_vector(text)[4] == 0.0  # the "version" group
    assert " version " not in features_text(text)
    assert vocab_vector("ONNX Runtime version 1.15 is older than the model's IR")[4] > 0


@pytest.mark.parametrize(
    "text",
    [
        # sgl-project/sglang#165 (the thread: out of memory, visible only in the discussion)
        "AttributeError: 'NoneType' object has no attribute 'cpu'",
        # unslothai/unsloth#1268 (a weight name; a model type such as Hunyuan-7B#3's is LOG072's, see
        # test_doctor_logs_model_types.py)
        "KeyError: 'layers.0.mlp.down_proj.weight'",
    ],
)
def test_generic_exception_without_cause_vocabulary_stays_unclassified(text: str) -> None:
    root = root_error(classify_text(text, "pasted.log", index=_index()))
    assert root is not None and root.code == "LOG000"
    assert root.evidence["generic_exception"] is True
    assert root.evidence["similar_cases"]  # the nearest known cases are still shown


def test_a_library_object_without_the_attribute_its_caller_uses_is_a_release_mismatch() -> None:
    # sgl-project/sglang#88 (the thread: an older sglang runtime); a NoneType one stays unclassified (above)
    text = (
        "    prefix_rid = backend.cache_prefix(prefix)\n"
        "AttributeError: 'Runtime' object has no attribute 'cache_prefix'"
    )
    root = root_error(classify_text(text, "pasted.log", index=_index()))
    assert root is not None and root.code == "LOG066"
    assert root.root_cause is RootCause.VERSION_COUPLING
    assert root.evidence["object"] == "Runtime" and root.evidence["name"] == "cache_prefix"
    assert "Runtime objects of the installed release have no attribute 'cache_prefix'" in root.message


def test_generic_exception_that_states_a_cause_still_reaches_known_cases() -> None:
    text = "AttributeError: 'Config' object has no attribute 'x': this model type is not supported"
    root = root_error(classify_text(text, "pasted.log", index=_index()))
    assert root is not None and "generic_exception" not in root.evidence
