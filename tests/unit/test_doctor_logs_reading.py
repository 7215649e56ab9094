"""usg doctor logs: error lines users paste without the usual markers are still read as errors.

Every excerpt is a real message users pasted in a public thread (the thread is named beside it)."""

from __future__ import annotations

import pytest

from usg.doctor.logs.classify import classify_text, root_error


@pytest.mark.parametrize(
    "text",
    [
        # ray-project/ray#37042: a space before the colon
        "[<Ray component: Serve>] ModuleNotFoundError : No module named utils",
        # AIDajiangtang/Segment-Anything-CSharp#1: ONNX Runtime's C# wrapping, pasted inside quotes
        "'[ErrorCode:RuntimeException] Non-zero status code returned while running Add node. "
        "Name:'/blocks.7/attn/Add_2' Status Message: bad allocation'",
        # microsoft/onnxruntime-inference-examples#367 without its "RUNTIME_EXCEPTION :" prefix
        "Non-zero status code returned while running Mul node. Name:'/time_proj/Mul' Status Message: "
        "/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal",
    ],
)
def test_unmarked_error_lines_are_findings(text: str) -> None:
    root = root_error(classify_text(text, "app.log", learned=False))
    assert root is not None and root.evidence["line_text"] == text.splitlines()[0].strip()[:400]


@pytest.mark.parametrize(
    "text",
    [
        "INFO model loaded: 0 errors",
        "Status Message: all good",
        "Errors : 0",
    ],
)
def test_lines_that_only_mention_errors_are_not_findings(text: str) -> None:
    assert classify_text(text, "app.log", learned=False) == []
