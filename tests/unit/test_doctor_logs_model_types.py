"""usg doctor logs: a model type the installed transformers does not know (``KeyError: '<model_type>'``), a Triton
platform the server release does not know, and ONNX Runtime's Python exceptions taken for error lines.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest
from logs_roots import root_of

from usg.doctor.findings import RootCause


@pytest.mark.parametrize(
    ("text", "model_type"),
    [
        # hiyouga/LlamaFactory#9178 (transformers older than Qwen3-Next)
        ("KeyError: 'qwen3_next' qwen3-next", "qwen3_next"),
        # Tencent-Hunyuan/Hunyuan-7B#3 (transformers older than the Hunyuan dense model)
        ("KeyError: 'hunyuan_v1_dense'", "hunyuan_v1_dense"),
        # vllm-project/vllm#4315 (DBRX before transformers had it: the frames name CONFIG_MAPPING)
        (
            '  File "/usr/local/lib/python3.10/dist-packages/transformers/models/auto/configuration_auto.py", line '
            '1155, in from_pretrained\n    config_class = CONFIG_MAPPING[config_dict["model_type"]]\n  File '
            '"/usr/local/lib/python3.10/dist-packages/transformers/models/auto/configuration_auto.py", line 852, in '
            "__getitem__\n    raise KeyError(key)\nKeyError: 'dbrx'",
            "dbrx",
        ),
    ],
)
def test_unknown_model_type_is_a_transformers_release_mismatch(text: str, model_type: str) -> None:
    root = root_of(text)
    assert root.code == "LOG072"
    assert root.root_cause is RootCause.VERSION_COUPLING
    assert root.evidence["model_type"] == model_type
    assert "upgrade transformers" in root.fix


@pytest.mark.parametrize(
    "text",
    [
        "KeyError: 'app3_Modell'",  # ray-project/ray#33579: a Serve config naming a deployment the app lacks
        "KeyError: 'layers.0.mlp.down_proj.weight'",  # unslothai/unsloth#1268: a weight name, not a model type
        "KeyError: 'input_ids'",  # a dict key without a digit: no model type is recognisable
    ],
)
def test_other_key_errors_are_not_read_as_model_types(text: str) -> None:
    root = root_of(text)
    assert root.code != "LOG072"


@pytest.mark.parametrize(
    ("text", "platform", "model"),
    [
        # triton-inference-server/server#911 (19.03 predates onnxruntime_onnx; confirmed by the reporter)
        ("unexpected platform type onnxruntime_onnx for faces", "onnxruntime_onnx", "faces"),
        # triton-inference-server/server#3026 (a Triton bug fixed in a later release)
        ("unexpected platform type tensorflow_savedmodel for rul", "tensorflow_savedmodel", "rul"),
        # triton-inference-server/server#4233 (labelled environment: a build without the TensorFlow backend; the
        # message is the same, so the rule names the more frequent cause and its fix covers both)
        (
            "Poll failed for model directory 'inception_graphdef': unexpected platform type 'tensorflow_graphdef' for "
            "inception_graphdef",
            "tensorflow_graphdef",
            "inception_graphdef",
        ),
    ],
)
def test_platform_unknown_to_the_triton_release_is_version_coupling(text: str, platform: str, model: str) -> None:
    root = root_of(text)
    assert root.code == "LOG073"
    assert root.root_cause is RootCause.VERSION_COUPLING
    assert (root.evidence["platform"], root.evidence["model"]) == (platform, model)
    assert "built with its backend" in root.fix


def test_onnxruntime_python_exception_is_an_error_line() -> None:
    # microsoft/onnxruntime#16153: "Fail --" is neither "failed" nor "...Error:", but it is ONNX Runtime's exception
    # (that message is read by LOG115 since session 21: the line below is one no rule knows)
    text = "onnxruntime.capi.onnxruntime_pybind11_state.Fail -- Protobuf serialization of the session state failed."
    root = root_of(text)
    assert root.code == "LOG000"
    assert "Protobuf serialization" in root.evidence["line_text"]
    known = root_of("onnxruntime.capi.onnxruntime_pybind11_state.Fail -- Unknown model file format version.")
    assert (known.code, known.root_cause) == ("LOG115", RootCause.VERSION_COUPLING)


def test_onnxruntime_missing_kernel_without_a_node_name_is_unsupported_op() -> None:
    # microsoft/onnxruntime#24919 (the message quoted in a sentence, without "node with name")
    text = (
        "onnxruntime can execute the model correctly with the CUDAExecutionProvider, while returning error code with "
        "the CPUExecutionProvider: NOT_IMPLEMENTED : Could not find an implementation for Resize(13)"
    )
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG009", RootCause.UNSUPPORTED_OP)
    assert (root.evidence["op"], root.evidence["opset"]) == ("Resize", 13) and "node" not in root.evidence


@pytest.mark.parametrize(
    ("text", "operator", "python_op"),
    [
        # pytorch/pytorch#21139 (no symbolic for aten::var in that exporter)
        ("RuntimeError: ONNX export failed: Couldn't export operator aten::var", "aten::var", False),
        # pranavphoenix/WaveMixSR#5 (an autograd Function without a symbolic)
        (
            "    ) = graph._export_onnx(  # type: ignore[attr-defined]\n"
            "RuntimeError: ONNX export failed: Couldn't export Python operator AFB2D",
            "AFB2D",
            True,
        ),
    ],
)
def test_operator_the_exporter_cannot_write_is_unsupported_op(text: str, operator: str, python_op: bool) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG013", RootCause.UNSUPPORTED_OP)
    assert root.evidence["operator"] == operator
    assert root.evidence.get("python_op", False) is python_op


@pytest.mark.parametrize(
    ("text", "evidence", "says"),
    [
        # huggingface/text-generation-inference#1451 (the launcher's flag values are lower-case)
        (
            "error: invalid value 'True' for '--disable-custom-kernels'\n  [possible values: true, false]",
            {"flag": "--disable-custom-kernels", "value": "True"},
            "does not accept",
        ),
        # sgl-project/sglang#302 (a ':branch' suffix makes the model path no repo id)
        (
            "huggingface_hub.utils._validators.HFValidationError: Repo id must use alphanumeric chars or '-', '_', "
            "'.', '--' and '..' are forbidden, '-' and '.' cannot start or end the name, max length is 96: "
            "'TheBloke/Mistral-7B-v0.1-GPTQ:gptq-4bit-32g-actorder_True'.",
            {"model_id": "TheBloke/Mistral-7B-v0.1-GPTQ:gptq-4bit-32g-actorder_True"},
            "valid Hugging Face repo id",
        ),
        # triton-inference-server/server#7497 (the checkpoint is not a complete torch archive)
        (
            "failed to load 'bert' version 1: Internal: failed to load model 'bert': PytorchStreamReader failed "
            "reading zip archive: failed finding central directory",
            {},
            "not a complete PyTorch archive",
        ),
        # triton-inference-server/tensorrtllm_backend#500 (an empty JSON config)
        (
            "UNAVAILABLE: Internal: unexpected error when creating modelInstanceState: "
            "[json.exception.parse_error.101] parse error at line 1, column 1: syntax error while parsing value - "
            "unexpected end of input;",
            {},
            "empty or malformed",
        ),
    ],
)
def test_input_the_program_cannot_parse_is_a_config_error(text: str, evidence: dict[str, str], says: str) -> None:
    root = root_of(text)
    assert (root.code, root.root_cause) == ("LOG074", RootCause.CONFIG_INVALID)
    assert says in root.message
    for key, value in evidence.items():
        assert root.evidence[key] == value
