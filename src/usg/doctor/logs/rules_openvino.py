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


# a chain of OpenVINO locations before the message ("Exception from a.cpp:1:\nException from b.cpp:2:\n<message>")
_CHAIN = r"(?:(?:Exception from|Check '[^'\n]*' failed at) \S+?:\d+:?\s*)*(?:\[\w+\]\s*)?"


@_rule(
    "LOG053",
    "openvino",
    "IR written by another OpenVINO release",
    R.VERSION_COUPLING,
    r"cannot parse future versions:? ?(?P<future>\d+)|The support of IR v(?P<removed>\d+) has been removed",
)
def _ov_ir_version(m: re.Match[str]) -> Explained:
    if m["future"]:
        return Explained(
            f"the IR is version {m['future']}, written by a newer OpenVINO than the runtime reading it (no forward "
            "compatibility)",
            "upgrade the OpenVINO runtime to the release that converted the model (or newer), or convert the model "
            "again with the Model Optimizer / ovc of the runtime's release",
            {"ir_version": int(m["future"])},
        )
    return Explained(
        f"IR v{m['removed']} was written by an old Model Optimizer and this OpenVINO no longer reads it",
        "convert the original model again with the converter of this OpenVINO release",
        {"ir_version": int(m["removed"])},
    )


@_rule(
    "LOG054",
    "openvino",
    "static shape required, dynamic dimension found",
    R.UNSUPPORTED_OP,
    _CHAIN + r"(?P<msg>Cannot get length of dynamic dimension|get_shape was called on a descriptor::Tensor with "
    r"dynamic shape|Cannot get dims for non static shape)",
)
def _ov_static(m: re.Match[str]) -> Explained:
    return Explained(
        "a static shape was required where the model has a dynamic dimension: the device plugin (MYRIAD/NCS2, older "
        f"GPU plugins) or the code calling it does not handle dynamic shapes ({m['msg']})",
        "give the model static input shapes for this device (model.reshape({...}) before compile_model, or convert "
        "with --input_shape / input=[...]), or run it on a device whose plugin supports dynamic shapes (CPU)",
        {"message": m["msg"]},
    )


@_rule(
    "LOG055",
    "openvino",
    "precision the plugin or the CPU does not support",
    R.DTYPE_OR_RANGE,
    _CHAIN + r"(?:(?:CPU )?plugin does not support (?P<prec>\w+)(?: for use with (?P<lib>\w+))?"
    r"|unsupported src_prc:? (?P<src>\w+)|Platform doesn't support (?P<hw>\w+) format)",
    also=(R.ENVIRONMENT,),
)
def _ov_precision(m: re.Match[str]) -> Explained:
    if m["hw"]:
        return Explained(
            f"the CPU has no {m['hw']} instructions, so OpenVINO refuses {m['hw']} inference on it",
            f"run in f32 (inference_precision f32 / drop the {m['hw']} hint), or use a CPU/device with {m['hw']} "
            "support",
            {"precision": m["hw"]},
            R.ENVIRONMENT,
        )
    prec = m["prec"] or m["src"]
    return Explained(
        f"the model computes in {prec}, a precision this OpenVINO plugin does not execute",
        f"convert the model (and its inputs) from {prec} to a supported precision (f32, or f16 for GPU/MYRIAD) "
        "before compiling, or use the plugin/device that supports it",
        {"precision": prec, "library": m["lib"]},
    )


@_rule(
    "LOG056",
    "openvino",
    "GPU plugin out of resources",
    R.MEMORY,
    _CHAIN + r"(?:\[GPU\]\s*)?(?P<msg>out of GPU resources|[^\n]{0,200}?CL_OUT_OF_RESOURCES)",
)
def _ov_gpu_oor(m: re.Match[str]) -> Explained:
    return Explained(
        "the OpenVINO GPU plugin ran out of device memory (CL_OUT_OF_RESOURCES / out of GPU resources): the model, "
        "its streams and batch do not fit the (integrated) GPU",
        "reduce memory: smaller batch or input shapes, fewer streams, compressed (int8/int4) weights; on integrated "
        "GPUs raise the shared-memory share or run on CPU; update the GPU driver",
        {"message": m["msg"].strip()[:200]},
    )


# the checked condition itself names a shape relation: element counts of a reshape, broadcasting
_SHAPE_CHECK = re.compile(r"broadcast|elements_equal|element_count|shape_size", re.IGNORECASE)


@_rule(
    "LOG035",
    "openvino",
    "OpenVINO check failed",
    R.MEMORY,
    _HEAD,
    also=(R.UNSUPPORTED_OP, R.SHAPE_OR_RANK),
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
    if _SHAPE_CHECK.search(m["cond"] or ""):
        ev["message"] = _message(rest)
        return Explained(
            f"OpenVINO's {component} found shapes that do not fit together (check {m['cond']!r}): a reshape whose "
            "element count differs, or inputs that do not broadcast",
            "check the input shapes given to the conversion/compile (static shapes that match the model's "
            "reshape targets), or reshape the model to the shapes it is run with",
            ev,
            R.SHAPE_OR_RANK,
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


# ONNX Runtime's per-node status ("Non-zero status code returned while running Add node ... Status Message:
# bad allocation"): one kernel's allocation failing at run time does not show the process is out of memory —
# ORT reports it too when the model and the runtime come from different builds. Known cases decide.
_NODE_STATUS = re.compile(r"Non-zero status code returned while running \w+ node", re.IGNORECASE)


@_rule("LOG037", "c++ runtime", "allocation failed (std::bad_alloc)", R.MEMORY, r"\bbad allocation\b|std::bad_alloc")
def _bad_alloc(m: re.Match[str]) -> Explained | None:
    if _NODE_STATUS.search(m.string, 0, m.start()):
        return None
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
    r"|Can't set the input tensor with (?:index: (?P<index>\d+)|name: (?P<name2>\S+?)), because the model input "
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
        name = m["name"] or m["name2"]
        ev = {"input": name if name else int(m["index"]), "model_shape": model, "sent_shape": sent}
        what = f"input {ev['input']!r}: the model takes shape {model} but {sent} was sent"
    return Explained(
        what,
        "resize/transpose the data to the model's input (NCHW vs NHWC, the image size it was converted for), or "
        "reshape the model to the size you send (model.reshape / convert with a dynamic input shape)",
        ev,
    )


@_rule(
    "LOG068",
    "openvino",
    "model cannot be read (frontends)",
    R.CONFIG_INVALID,
    r"Unable to read the model:\s*(?P<path>[^\n]*?)\s*Please check that model format: (?P<fmt>\w+) is supported and "
    r"the model is correct\.\s*Available frontends:(?P<fe>[ \t\w]*)",
    also=(R.ENVIRONMENT,),
)
def _unreadable_model(m: re.Match[str]) -> Explained:
    frontends = m["fe"].split()
    path = m["path"].strip() or None
    if not frontends:  # no frontend library was found at all: the install or the packaged app lacks them
        return Explained(
            "OpenVINO found no model frontend library at all (the list of available frontends is empty), so it "
            f"cannot read any {m['fmt']} model",
            "deploy OpenVINO's frontend libraries (libopenvino_ir_frontend, _onnx_frontend, ...) with the application: "
            "a full pip/archive install, or include them when bundling (Android, PyInstaller/Nuitka, custom builds)",
            {"path": path, "format": m["fmt"], "frontends": []},
            R.ENVIRONMENT,
        )
    return Explained(
        f"OpenVINO has frontends for {', '.join(frontends)} but none could read {path or 'the model'}: the file does "
        "not exist at that path, or it is not a valid model of that format (truncated, wrong file, its .bin missing)",
        "check the path the application passes (relative to which directory) and that the file (and the .bin next "
        "to an .xml) is complete; re-export the model if it is corrupted",
        {"path": path, "format": m["fmt"], "frontends": frontends},
    )


@_rule(
    "LOG069",
    "openvino",
    "device plugin cannot be created",
    R.ENVIRONMENT,
    r"Failed to create plugin (?P<lib>\S+?) for device (?P<dev>[\w.]+)"
    r"|(?P<nocl>No OpenCL device found which would match provided configuration)",
)
def _plugin(m: re.Match[str]) -> Explained:
    if m["nocl"]:  # the GPU plugin found no Intel GPU it can drive
        vendor = re.search(r"([^\n:]{1,60}): invalid vendor type", m.string[m.end() : m.end() + 300])
        return Explained(
            "OpenVINO's GPU plugin found no OpenCL device it can use"
            + (f" ({vendor.group(1).strip()} is not an Intel GPU)" if vendor else "")
            + ": it drives Intel GPUs through Intel's OpenCL runtime only",
            "run on an Intel GPU with Intel's compute runtime installed (and visible: /dev/dri in containers), or use "
            "the CPU device",
            {"plugin": None, "device": "GPU", "other_device": vendor.group(1).strip() if vendor else None},
        )
    cl = re.search(r"cl\w+ error -?\d+", m.string[m.end() : m.end() + 300])
    return Explained(
        f"OpenVINO cannot create its {m['dev']} plugin ({m['lib'].rsplit('/', 1)[-1]})"
        + (f": {cl.group(0)}" if cl else "")
        + ": the device's driver/compute runtime is missing, too old for this GPU, or not visible to the process",
        f"install the {m['dev']} driver and compute runtime (for GPU: Intel's OpenCL/Level Zero runtime) matching this "
        "hardware and OpenVINO release, give the container access to the device (/dev/dri), or run on CPU",
        {"plugin": m["lib"], "device": m["dev"], "runtime_error": cl.group(0) if cl else None},
    )
