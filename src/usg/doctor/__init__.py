"""usg.doctor: check models, serving configs and graphs before deploy.

``run_doctor(paths)`` detects what each path is (ONNX file, Triton repository or
model, USG graph YAML, Hugging Face model dir), runs every registered check and
returns a :class:`DoctorReport` of :class:`Finding` objects; ``render`` turns
findings from any stage into text, JSON, HTML or SARIF, each with the
root-cause matrix.
"""

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.matrix import MatrixRow, root_cause_matrix
from usg.doctor.registry import CodeInfo, all_codes, check
from usg.doctor.render import render
from usg.doctor.runner import CheckContext, DoctorReport, parse_targets, run_doctor

__all__ = [
    "CheckContext",
    "CodeInfo",
    "DoctorReport",
    "Finding",
    "Location",
    "MatrixRow",
    "RootCause",
    "Severity",
    "Stage",
    "all_codes",
    "check",
    "parse_targets",
    "render",
    "root_cause_matrix",
    "run_doctor",
]
