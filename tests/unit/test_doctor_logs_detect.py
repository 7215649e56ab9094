"""usg doctor logs: the error detector sees errors by their shape, in any engine's words, and leaves benign lines.

The shapes: an exception class named anywhere on a line, a C++ exception nobody caught, ONNX Runtime's own error
records, a process ended by a fatal signal, a traceback the paste cuts off before its exception line. Where an
excerpt comes from a public thread the thread is named beside it; the others are the engines' and the C/C++
runtimes' own wordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from usg.cli.doctor_logs_cmd import logs
from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error


@pytest.mark.parametrize(
    "text",
    [
        # microsoft/onnxruntime#12781: ONNX Runtime's error record, no other marker on the line
        "2022-08-30 09:05:11.778016267 [E:onnxruntime:, inference_session.cc:1587 operator()] Exception during "
        "initialization: tensorrt_execution_provider.cc:798 GetSupportedList",
        "[F:onnxruntime:Default, env.cc:234 ThreadMain] pthread_setaffinity_np returned 22",
        # microsoft/onnxruntime#13330: DirectML's C++ exception, thrown with its text
        'DirectML.dll/TensorValidator.h(439) Exception "The parameter is incorrect.".',
        # microsoft/onnxruntime#20069
        "OpenVINO: Encountered unknown exception in Run()",
        # an exception class named inside the line, not at its start
        "Node (MatMulBnFusion_Gemm) Op (Gemm) [ShapeInferenceError] First input does not have rank 2",
        "terminate called after throwing an instance of 'nvinfer1::MyelinError'",
        "Unhandled exception. Microsoft.ML.OnnxRuntime.OnnxRuntimeException thrown by the session",
        # a C++ exception nobody caught, and its what() line
        "terminate called after throwing an instance of 'std::runtime_error'",
        "  what():  basic_string::_M_construct null not valid",
        # openvinotoolkit/openvino#33444, triton-inference-server/model_analyzer#162: "fails"/"Fail to"
        'Pad node compilation fails with "Argument element types do not match"',
        'Fail to analyze ensemble model: "inference.ModelConfig" should not have multiple "scheduling_choice" fields',
        # fatal signals: huggingface/text-generation-inference#2293, gladiaio/gladia#561, and other runtimes' words
        "2024-07-22T10:00:00Z ERROR Shard process was signaled to shutdown with signal 11 rank=0",
        "Shard process was signaled to shutdown with signal 11 rank=0",
        "[2022-08-09 19:14:14 +0000] [1926] [WARNING] Worker with pid 2084 was terminated due to signal 9",
        "Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)",
        "Received SIGSEGV in worker 3",
        "Worker exited with SIGABRT",
    ],
)
def test_errors_of_any_engine_are_findings(text: str) -> None:
    root = root_error(classify_text(text, "app.log", learned=False))
    assert root is not None and root.evidence["line_text"] == text.strip()[:400]


@pytest.mark.parametrize(
    "text",
    [
        "INFO Received signal 15 (SIGTERM), shutting down gracefully",
        "INFO:     Shutting down on SIGINT",
        "INFO signal handlers installed (SIGTERM, SIGINT)",
        "2024-01-01 10:00:00 INFO retry policy: on_error=retry, max_error=0.01",
        "INFO: exceptions are logged to /tmp/x",
        "INFO registered handlers: ErrorHandler, ExceptionMapper",
        "INFO model loaded; test fails=0",
        "DEBUG errors_total=0 failures_total=0",
        # ONNX Runtime's warning record
        "[W:onnxruntime:, graph.cc:3593 CleanUnusedInitializersAndNodeArgs] Removing initializer 'x'. It is not used",
        # an engine warning that names an exception stays a warning
        "FutureWarning: passing a tuple of indices will raise a ValueError in a future release",
        "UserWarning: this call will raise RuntimeError in torch 2.6",
    ],
)
def test_benign_lines_are_not_findings(text: str) -> None:
    assert classify_text(text, "app.log", learned=False) == []


def test_a_traceback_cut_off_before_its_exception_leaves_the_line_announcing_it() -> None:
    # vllm-project/vllm#9713: the paste ends at the traceback's first line
    text = (
        "ERROR 10-26 11:35:32 registry.py:267] Error in inspecting model architecture 'LlamaForCausalLM'\n"
        "ERROR 10-26 11:35:32 registry.py:267] Traceback (most recent call last):"
    )
    root = root_error(classify_text(text, "app.log", learned=False))
    assert root is not None and root.location.line == 1
    assert "Error in inspecting model architecture" in root.evidence["line_text"]


def test_a_whole_traceback_is_still_read_by_its_exception_line() -> None:
    text = (
        "ERROR 10-26 11:35:32 registry.py:267] Error in inspecting model architecture 'LlamaForCausalLM'\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: Unknown engine argument: task"
    )
    findings = classify_text(text, "app.log", learned=False)
    assert [f.location.line for f in findings] == [4]


def test_a_fatal_signal_says_how_a_process_died_not_why() -> None:
    # huggingface/text-generation-inference#2293 (a segfault labelled unsupported_op); the known SIGILL cases are
    # environment: a learned guess from them would be a wrong class, so the line stays unclassified
    findings = classify_text("Shard process was signaled to shutdown with signal 11 rank=0", "app.log")
    root = root_error(findings)
    assert root is not None and root.code == "LOG000" and root.root_cause is RootCause.UNCLASSIFIED
    assert root.evidence.get("cascade") is True


def test_sigill_is_still_read_by_its_rule() -> None:
    root = root_error(classify_text("Shard process was signaled to shutdown with signal 4 rank=0", "app.log"))
    assert root is not None and root.root_cause is RootCause.ENVIRONMENT


def test_the_cli_does_not_call_a_log_with_a_segfault_clean(tmp_path: Path) -> None:
    # before: "no findings", exit 0, for a server log whose only error was ONNX Runtime's record or a fatal signal
    log = tmp_path / "server.log"
    log.write_text(
        "2022-08-30 09:05:11.1 [I:onnxruntime:, inference_session.cc:1400] Initializing session.\n"
        "2022-08-30 09:05:11.7 [E:onnxruntime:, inference_session.cc:1587 operator()] Exception during "
        "initialization: tensorrt_execution_provider.cc:798 GetSupportedList\n"
        "INFO Loading shard 0\n"
        "Shard process was signaled to shutdown with signal 11 rank=0\n"
    )
    res = CliRunner().invoke(logs, [str(log), "--format", "json"])
    assert res.exit_code == 1, res.output
    lines = [f["location"]["line"] for f in json.loads(res.output)["findings"]]
    assert lines == [2, 4]
