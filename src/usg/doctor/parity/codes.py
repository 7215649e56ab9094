"""The codes a parity run emits (PAR000-PAR006), registered once for :mod:`.run` and :mod:`.export`."""

from __future__ import annotations

from usg.doctor.findings import RootCause, Severity
from usg.doctor.registry import CodeInfo, register_codes

__all__ = ["PARITY_CODES"]

PARITY_CODES = (
    CodeInfo("PAR000", Severity.INFO, RootCause.UNCLASSIFIED, "parity summary", "exporter and max errors"),
    CodeInfo(
        "PAR001",
        Severity.ERROR,
        RootCause.DYNAMIC_SHAPE_FIXED,
        "shape frozen by export",
        "the ONNX model matches at the export shape but fails or differs at another size",
    ),
    CodeInfo(
        "PAR002",
        Severity.ERROR,
        RootCause.OP_SEMANTIC_DRIFT,
        "numeric drift",
        "ONNX Runtime and PyTorch differ beyond tolerance at the export shape",
    ),
    CodeInfo(
        "PAR003",
        Severity.ERROR,
        RootCause.UNSUPPORTED_OP,
        "export failed",
        "an ONNX exporter raised (a warning when another exporter then succeeded; the cause is read "
        "from the exception: an op the exporter lacks, a data-dependent shape, or unclassified)",
        also_severities=(Severity.WARNING,),
        also_root_causes=(RootCause.DYNAMIC_SHAPE_FIXED, RootCause.UNCLASSIFIED),
    ),
    CodeInfo(
        "PAR004",
        Severity.WARNING,
        RootCause.SHAPE_OR_RANK,
        "torch fails at shape",
        "the eager model rejects a size",
    ),
    CodeInfo(
        "PAR005",
        Severity.ERROR,
        RootCause.DYNAMIC_SHAPE_FIXED,
        "dynamic axis exported fixed",
        "an axis meant to be dynamic has a fixed size in the ONNX graph inputs",
    ),
    CodeInfo(
        "PAR006",
        Severity.ERROR,
        RootCause.SHAPE_OR_RANK,
        "ONNX fails at export shape",
        "ONNX Runtime fails on the export inputs themselves, or returns a different number of outputs",
    ),
)
register_codes(PARITY_CODES)
