"""Render findings as SARIF 2.1.0 (what GitHub code scanning uploads).

Each code becomes a rule (documented from the registry), each finding a result
with its file, line/column when known, the element as a logical location, and
evidence, fix, root cause and stage as properties. The root-cause matrix rides
in the run's property bag.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, Severity
from usg.doctor.matrix import root_cause_matrix
from usg.doctor.registry import all_codes

__all__ = ["SARIF_SCHEMA", "render_sarif", "sarif_dict"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _uri(file: str) -> str:
    path = Path(file)
    try:
        rel = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path.resolve().as_uri() if path.is_absolute() or path.exists() else path.as_posix()
    return rel.as_posix()


def _version() -> str:
    try:
        return metadata.version("usg")
    except metadata.PackageNotFoundError:
        return "0"


def _rules(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    docs = {c.code: c for c in all_codes()}
    used = sorted({f.code for f in findings} | set(docs))
    rules = []
    for code in used:
        info = docs.get(code)
        if info is not None:
            title, text, level, rc = (
                info.title,
                info.explanation,
                _LEVEL[info.severity],
                info.root_cause.value,
            )
        else:
            sample = next(f for f in findings if f.code == code)
            title, text, level, rc = (
                sample.message,
                sample.message,
                _LEVEL[sample.severity],
                sample.root_cause,
            )
        rules.append(
            {
                "id": code,
                "name": "".join(w.capitalize() for w in title.replace("/", " ").split() if w.isalnum()) or code,
                "shortDescription": {"text": title},
                "fullDescription": {"text": text},
                "help": {"text": f"{text} Run `usg doctor --list-checks` for every code."},
                "defaultConfiguration": {"level": level},
                "properties": {"root_cause": str(rc), "tags": ["usg-doctor", str(rc)]},
            }
        )
    return rules


def _result(f: Finding, rule_index: int) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(f.location.file)}}
    if f.location.line is not None and f.location.line >= 1:
        region: dict[str, Any] = {"startLine": f.location.line}
        if f.location.column is not None and f.location.column >= 1:
            region["startColumn"] = f.location.column
        physical["region"] = region
    location: dict[str, Any] = {"physicalLocation": physical}
    if f.location.element:
        location["logicalLocations"] = [{"name": f.location.element}]
    return {
        "ruleId": f.code,
        "ruleIndex": rule_index,
        "level": _LEVEL[f.severity],
        "message": {"text": f"{f.message.rstrip('.')}. Fix: {f.fix}"},
        "locations": [location],
        "properties": {
            "root_cause": f.root_cause.value,
            "stage": f.stage.value,
            "fix": f.fix,
            "evidence": json.loads(json.dumps(f.evidence, default=str)),
        },
    }


def sarif_dict(findings: Sequence[Finding]) -> dict[str, Any]:
    rules = _rules(findings)
    index = {r["id"]: i for i, r in enumerate(rules)}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "usg-doctor", "version": _version(), "rules": rules}},
                "results": [_result(f, index[f.code]) for f in findings],
                "columnKind": "unicodeCodePoints",
                "properties": {"root_cause_matrix": [row.to_dict() for row in root_cause_matrix(findings)]},
            }
        ],
    }


def render_sarif(findings: Sequence[Finding], **_: Any) -> str:
    return json.dumps(sarif_dict(findings), indent=2) + "\n"
