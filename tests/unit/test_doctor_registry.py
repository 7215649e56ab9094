"""Findings are built from the registry: a code fixes its severity, root cause and title."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import usg.doctor
from usg.doctor.findings import Location, RootCause, Severity, Stage
from usg.doctor.registry import CodeInfo, all_codes, code_info, finding, register_codes
from usg.doctor.runner import CHECK_MODULES, CODE_DOC_MODULES, load_check_modules

DOCTOR = Path(usg.doctor.__file__).parent


@pytest.fixture(scope="module", autouse=True)
def _loaded() -> None:
    load_check_modules(CHECK_MODULES + CODE_DOC_MODULES)


def test_every_registered_code_builds_at_its_registered_severity_and_cause() -> None:
    codes = all_codes()
    assert len(codes) > 90  # every check module registered its codes
    for info in codes:
        f = finding(info.code, "m", Location("x"), "fix it", {"n": 1}, stage=Stage.LOGS)
        assert (f.code, f.severity, f.root_cause, f.stage) == (info.code, info.severity, info.root_cause, Stage.LOGS)
        assert f.evidence == {"n": 1}
        for sev in info.also_severities:
            assert finding(info.code, "m", Location("x"), "f", severity=sev).severity is sev
        for sev in set(Severity) - set(info.severities()):
            with pytest.raises(ValueError, match=f"{info.code} is registered as {info.severity.value}"):
                finding(info.code, "m", Location("x"), "f", severity=sev)
        for cause in set(RootCause) - set(info.root_causes()):
            with pytest.raises(ValueError, match=f"{info.code} is registered with root cause"):
                finding(info.code, "m", Location("x"), "f", root_cause=cause)


def test_unregistered_code_is_refused() -> None:
    with pytest.raises(LookupError, match="'NOPE001' is not registered"):
        finding("NOPE001", "m", Location("x"), "f")


def test_a_code_cannot_be_registered_twice_with_another_meaning() -> None:
    info = code_info("HF005")
    register_codes([info])  # the same meaning again is fine
    with pytest.raises(RuntimeError, match="HF005 registered twice"):
        register_codes([CodeInfo("HF005", Severity.WARNING, info.root_cause, info.title, info.explanation)])


def test_hf005_is_registered_as_the_error_it_is_emitted_as() -> None:
    assert code_info("HF005").severity is Severity.ERROR


def test_no_doctor_module_builds_a_finding_by_hand() -> None:
    """Only the registry constructs ``Finding``; every check goes through ``finding(code, ...)``."""
    offenders = []
    for path in sorted(DOCTOR.rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
                offenders.append(f"{path.relative_to(DOCTOR)}:{node.lineno}")
    assert offenders == []
