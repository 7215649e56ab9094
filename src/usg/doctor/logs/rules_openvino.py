"""Log rules for OpenVINO's own error form: ``Check '<condition>' failed at <file>:<line>:`` (and, since
2023, ``Exception from <file>:<line>:``) followed by the message that says what went wrong.

The head line names only the C++ check and where it sits; the cause is in the message after it (on
the same line or the next ones, often below a chain of nested ``Exception from`` lines). The rule
reads that message and the component the file belongs to (CPU/GPU plugin, a frontend, core shape
inference) and classifies only what the message states: an allocation failure, an operation the
plugin or frontend cannot handle. Other messages (a node failing validation, whose cause may be the
model or the converter) are left to the learned layer and its known cases.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (before the drift rule).
"""

from __future__ import annotations

import re
from typing import Any

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []

_HEAD = (
    r"(?:Check '(?P<cond>[^\n]*?)' failed at|(?-i:Exception from)) (?P<file>\S+?\.(?:cpp|hpp|cc|h)):(?P<line>\d+):?"
    r"(?P<rest>[^\n]*(?:\n[^\n]*){0,4})"
)
_NESTED = re.compile(r"^\s*(?:Exception from \S+?:\d+:?|Check '[^\n]*?' failed at \S+?:\d+:?)\s*$")
_ALLOC = re.compile(
    r"Failed to allocate (?P<bytes>\d+) bytes|Exceeded max size of memory allocation|\bbad allocation\b|"
    r"Could not allocate memory|out of (?:host |device )?memory|CL_OUT_OF_\w*MEMORY",
    re.IGNORECASE,
)
_UNSUPPORTED = re.compile(
    r"no translator found for operation\(?s?\)?:?\s*(?P<ops>[^\n]+)|doesn't support (?P<op>\w+) operation|"
    r"Unsupported (?:operation|primitive|dynamic ops)[:\s]*(?P<what>[^\n]*)|Cannot create (?P<layer>\w+) layer",
    re.IGNORECASE,
)
_COMPONENTS = (
    ("intel_cpu", "CPU plugin"),
    ("intel_gpu", "GPU plugin"),
    ("intel_npu", "NPU plugin"),
    ("frontends", "model frontend"),
    ("shape_inference", "core shape inference"),
    ("core/src/op", "core op validation"),
    ("inference", "inference runtime"),
)


_LOCATION = re.compile(r"(?:Exception from|failed at) (\S+?\.(?:cpp|hpp|cc|h)):\d+")


def _component(path: str, rest: str) -> str:
    """The component of the innermost location (nested ``Exception from`` lines go inwards)."""
    inner = _LOCATION.findall(rest)
    norm = (inner[-1] if inner else path).replace("\\", "/")
    return next((name for key, name in _COMPONENTS if key in norm), "OpenVINO")


_PREFIX = re.compile(r"^[\w.\-]+\s+\|\s+")  # "model-server-1  | " put before every line by docker compose


def _message(rest: str) -> str:
    """The first line of the message after the check's location, past nested ``Exception from`` lines."""
    for line in rest.splitlines():
        line = _PREFIX.sub("", line)
        text = line.strip(" :")
        if text and not _NESTED.match(line):
            return text
    return ""


@_rule(
    "LOG035",
    "openvino",
    "OpenVINO check failed",
    R.MEMORY,
    _HEAD,
    also=(R.UNSUPPORTED_OP,),
)
def _ov_check(m: re.Match[str]) -> Explained | None:
    rest = m["rest"] or ""
    component = _component(m["file"], rest)
    ev: dict[str, Any] = {"check": m["cond"], "source": f"{m['file']}:{m['line']}", "component": component}
    alloc = _ALLOC.search(rest)
    if alloc:
        ev["message"] = _message(rest)
        if alloc["bytes"]:
            n = int(alloc["bytes"])
            ev["bytes_requested"] = n
            ev["gib_requested"] = round(n / 2**30, 1)
        size = f" ({ev['gib_requested']} GiB)" if "gib_requested" in ev else ""
        return Explained(
            f"the OpenVINO {component} could not allocate memory{size}: {ev['message'][:200]}",
            "lower what the model needs at compile time (smaller input shapes or batch, fp16/int8 weights), use a "
            "device with more memory, or check that the size is plausible (a size of terabytes points to a shape "
            "the plugin computed from an unbounded or wrong dynamic dimension: set static input shapes)",
            ev,
        )
    unsupported = _UNSUPPORTED.search(rest)
    if unsupported:
        ops = unsupported["ops"] or unsupported["op"] or unsupported["what"] or unsupported["layer"] or ""
        ev["operations"] = ops.strip()[:300]
        ev["message"] = _message(rest)
        return Explained(
            f"the OpenVINO {component} cannot handle operation(s) {ev['operations'] or '(see message)'}",
            "upgrade OpenVINO (operation support grows with each release), convert the model with the operation "
            "replaced or removed (e.g. static shapes instead of dynamic rank), add a frontend extension, or run "
            "that part on another device/runtime",
            ev,
            R.UNSUPPORTED_OP,
        )
    return None  # e.g. "While validating node ...": the model's shapes or the converter — known cases decide


@_rule(
    "LOG036",
    "openvino",
    "operation not supported by the plugin",
    R.UNSUPPORTED_OP,
    r"unsupported primitive of type:? (?P<type>\w+)(?: name:? (?P<name>\S+))?"
    r"|Unsupported dynamic ops:?\s*(?P<ops>[^\n]*(?:\n[^\n]*)?)",
)
def _ov_unsupported(m: re.Match[str]) -> Explained:
    if m["type"]:
        ev: dict[str, Any] = {"operation": m["type"], "node": m["name"]}
        what = f"operation {m['type']}" + (f" (node {m['name']})" if m["name"] else "")
    else:
        ev = {"dynamic_ops": " ".join(m["ops"].split())[:300]}
        what = "operations with dynamic output shapes (" + (ev["dynamic_ops"][:120] or "see the list below") + ")"
    return Explained(
        f"the OpenVINO device plugin cannot execute {what}",
        "upgrade OpenVINO or use a device whose plugin supports it (CPU supports most), give the model static "
        "shapes where the op is dynamic (NonZero/If outputs), or replace the op before conversion",
        ev,
    )


@_rule("LOG037", "c++ runtime", "allocation failed (std::bad_alloc)", R.MEMORY, r"\bbad allocation\b|std::bad_alloc")
def _bad_alloc(m: re.Match[str]) -> Explained:
    return Explained(
        "a C++ allocation failed (std::bad_alloc): the process ran out of host memory while building or running "
        "the model",
        "free host memory or add swap, compile for a smaller input shape/batch or with compressed (fp16/int8) "
        "weights, or use a device that holds the model",
        {},
    )


@_rule(
    "LOG044",
    "openvino",
    "input tensor does not fit the model input",
    R.SHAPE_OR_RANK,
    r"(?:Can't SetBlob with name: (?P<name>\S+?),? because model input \(shape=(?P<model>\(?[^()]*\)?)\) and blob "
    r"\(shape=(?P<blob>\(?[^()]*\)?)\) are incompatible"
    r"|Can't set the input tensor with index: (?P<index>\d+), because the model input "
    r"\(shape=(?P<model2>\(?[^()]*\)?)\) and the tensor \(shape=(?P<tensor>\(?[^()]*\)?)\) are incompatible"
    r"|The input blob size is not equal to the network input size: got (?P<got>\d+) expecting (?P<exp>\d+))",
)
def _ov_input(m: re.Match[str]) -> Explained:
    if m["got"]:
        got, exp = int(m["got"]), int(m["exp"])
        ev: dict[str, Any] = {"got_elements": got, "expected_elements": exp, "ratio": round(got / exp, 3)}
        what = f"the input has {got} elements but the network takes {exp} ({got / exp:.2f}x)"
    else:
        model, sent = m["model"] or m["model2"], m["blob"] or m["tensor"]
        ev = {"input": m["name"] or int(m["index"]), "model_shape": model, "sent_shape": sent}
        what = f"input {ev['input']!r}: the model takes shape {model} but {sent} was sent"
    return Explained(
        what,
        "resize/transpose the data to the model's input (NCHW vs NHWC, the image size it was converted for), or "
        "reshape the model to the size you send (model.reshape / convert with a dynamic input shape)",
        ev,
    )
