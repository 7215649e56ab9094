"""The rules of ``usg doctor logs`` for serving runtimes (Triton, ONNX Runtime) and CUDA memory,
and the assembled :data:`RULES` (these first, then :mod:`usg.doctor.logs.rules_engines`).
"""

from __future__ import annotations

import re
from dataclasses import replace
from importlib import import_module
from typing import Any

from usg.doctor.findings import Severity
from usg.doctor.logs.rule_base import Explained, LogRule, R, _rule, rules
from usg.doctor.registry import CodeInfo

__all__ = ["RULES", "Explained", "LogRule", "codes"]


_ITEM = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "float16": 2,
    "fp16": 2,
    "bf16": 2,
    "int32": 4,
    "fp32": 4,
    "float": 4,
    "float32": 4,
    "int64": 8,
    "fp64": 8,
    "double": 8,
}
_BYTE_RATIO = {
    4: "uint8 (1 byte) data was sent where float32 (4 bytes) is expected: the image was not converted/normalised",
    2: "a 2-byte type was sent where a 4-byte one is expected (float16 vs float32, or int32 vs int64)",
    8: "uint8 data was sent where a float64/int64 input is expected",
    0.5: "a 4-byte type was sent where a 2-byte one is expected (float32 to a float16 input), or int64 to int32",
    0.25: "float32 data was sent where uint8 is expected (the model does its own preprocessing)",
    0.125: "float64/int64 data was sent where uint8 is expected",
}


def _bytes_explain(expected: int, got: int, where: str) -> Explained:
    ratio = expected / got if got else 0.0
    ev: dict[str, Any] = {"expected_bytes": expected, "got_bytes": got, "ratio": round(ratio, 4)}
    for r, why in _BYTE_RATIO.items():
        if abs(ratio - r) < 1e-9:
            return Explained(
                f"{where}: expected {expected} bytes, got {got} — byte ratio {ratio:g}: {why}",
                "convert the client tensor to the model's dtype before sending (e.g. "
                "img.astype(np.float32) / 255 for a float32 input), or declare the input as the dtype you "
                "send",
                ev,
                R.DTYPE_OR_RANGE,
            )
    if ratio in (3.0, 1 / 3):
        return Explained(
            f"{where}: expected {expected} bytes, got {got} — ratio {ratio:g}: a channel dimension of 3 is "
            "missing or extra (grayscale vs RGB, or HWC vs batched)",
            "check the channel count and the layout of the input (NCHW/NHWC) against the model's dims",
            ev,
            R.SHAPE_OR_RANK,
        )
    return Explained(
        f"{where}: expected {expected} bytes, got {got} (ratio {ratio:.3g}): the sent shape differs from the "
        "declared one",
        "send the shape the model declares (check batch and spatial sizes), or pad/resize on the client",
        ev,
        R.SHAPE_OR_RANK,
    )


@_rule(
    "LOG001",
    "triton",
    "input byte size mismatch",
    R.DTYPE_OR_RANGE,
    r"(?:not enough space|byte size mismatch for input '(?P<input>[^']+)'[^.]*\.)\s*:?\s*expected "
    r"(?P<exp>\d+),? got (?P<got>\d+)",
    also=(R.SHAPE_OR_RANK,),
)
def _byte_size(m: re.Match[str]) -> Explained:
    return _bytes_explain(int(m["exp"]), int(m["got"]), f"input {m['input']!r}" if m["input"] else "buffer")


@_rule(
    "LOG001",
    "triton",
    "input byte size mismatch",
    R.DTYPE_OR_RANGE,
    r"(?:unexpected total byte size|invalid size) (?P<got>\d+)(?: bytes)? for input '(?P<input>[^']+)', "
    r"expect(?:ing|s) (?P<exp>\d+)",
    also=(R.SHAPE_OR_RANK,),
)
def _byte_size2(m: re.Match[str]) -> Explained:
    return _bytes_explain(int(m["exp"]), int(m["got"]), f"input {m['input']!r}")


@_rule(
    "LOG002",
    "triton",
    "input datatype mismatch",
    R.DTYPE_OR_RANGE,
    r"(?:unexpected datatype (?P<got>TYPE_\w+) for (?:inference )?input '(?P<input>[^']+)', expecting (?P<exp>TYPE_\w+)"
    r"|inference input data-type is '(?P<got2>\w+)', model expects '(?P<exp2>\w+)' for '(?P<input2>[^']+)')",
)
def _triton_dtype(m: re.Match[str]) -> Explained:
    got, exp, inp = m["got"] or m["got2"], m["exp"] or m["exp2"], m["input"] or m["input2"]
    hint = ""
    if "INT64" in got.upper() and "INT32" in exp.upper():
        hint = " (tokenizers return int64 ids; TensorRT engines take int32)"
    return Explained(
        f"input {inp!r} was sent as {got} but the model expects {exp}{hint}",
        f"cast on the client (np.asarray(x, dtype=...) matching {exp}) or change data_type in config.pbtxt "
        "to what the model really takes",
        {"input": inp, "got": got, "expected": exp},
    )


@_rule(
    "LOG003",
    "triton",
    "dimension outside the engine's profile",
    R.BATCH_DIM_CONFIG,
    r"(?:input '(?P<input>[^']+)'.*?)?expected the shape of dimension (?P<dim>\d+) to be between "
    r"(?P<lo>-?\d+) and (?P<hi>-?\d+) but received (?P<got>-?\d+)",
    also=(R.DYNAMIC_SHAPE_FIXED,),
)
def _profile(m: re.Match[str]) -> Explained:
    dim, lo, hi, got = int(m["dim"]), int(m["lo"]), int(m["hi"]), int(m["got"])
    ev = {"dimension": dim, "min": lo, "max": hi, "received": got, "input": m["input"]}
    if dim == 0:
        return Explained(
            f"the TensorRT engine/profile accepts batch {lo}..{hi} on dimension 0 but received {got}"
            + (": the engine was built for batch 1" if hi == 1 else ""),
            f"rebuild the engine with an optimization profile max batch >= {got} "
            f"(trtexec --maxShapes=<input>:{got}x...) or set max_batch_size <= {hi} in config.pbtxt",
            ev,
        )
    return Explained(
        f"dimension {dim} must be in [{lo}, {hi}] for this engine profile, received {got}",
        f"rebuild the engine with a profile covering {got} on dimension {dim} "
        "(--minShapes/--optShapes/--maxShapes), "
        "or pad/truncate inputs to the profile",
        ev,
        R.DYNAMIC_SHAPE_FIXED,
    )


@_rule(
    "LOG004",
    "triton",
    "batch size above max_batch_size",
    R.BATCH_DIM_CONFIG,
    r"inference request batch-size must be <= (?P<max>\d+) for '(?P<model>[^']+)'",
)
def _max_batch(m: re.Match[str]) -> Explained:
    return Explained(
        f"a request's batch is larger than max_batch_size {m['max']} of model {m['model']!r}",
        "split the request into batches of at most max_batch_size, or raise max_batch_size (the model must "
        "accept that batch on dimension 0)",
        {"max_batch_size": int(m["max"]), "model": m["model"]},
    )


@_rule(
    "LOG005",
    "triton",
    "config dims vs model dims",
    R.BATCH_DIM_CONFIG,
    r"(?:tensor '(?P<tensor>[^']+)': )?the model expects (?P<n>\d+) dimensions \(shape (?P<model>\[[^\]]*\])\) "
    r"but the model "
    r"configuration specifies (?P<m>\d+) dimensions(?P<rest>[^\n]*)",
    also=(R.CONFIG_INVALID, R.DYNAMIC_SHAPE_FIXED),
)
def _config_dims(m: re.Match[str]) -> Explained:
    rest = m["rest"]
    name = f"tensor {m['tensor']!r}" if m["tensor"] else "a tensor"
    batch = "max_batch_size > 0" in rest
    model_shape = m["model"]
    ev: dict[str, Any] = {
        "tensor": m["tensor"],
        "model_shape": model_shape,
        "model_rank": int(m["n"]),
        "config_rank": int(m["m"]),
    }
    config = re.search(r"(?:complete shape|\(shape) (\[[^\]]*\])", rest)
    frozen = _frozen_axes(model_shape, config[1]) if config else []
    if config:
        ev["config_shape"] = config[1]
    if frozen:  # the config leaves an axis free that the exported model fixed: the export froze it
        ev["frozen_axes"] = frozen
        return Explained(
            f"{name}: the model fixes axis {frozen} ({model_shape}) where config.pbtxt "
            f"declares it variable ({config[1] if config else ''}): the model was exported with that axis static",
            "re-export the model with the axis dynamic (dynamic_axes / dynamic_shapes for every variable axis), or "
            "declare the model's fixed size in config.pbtxt",
            ev,
            R.DYNAMIC_SHAPE_FIXED,
        )
    if batch and not model_shape.startswith("[-1"):
        return Explained(
            f"{name}: the model has a fixed first dimension {model_shape} but config.pbtxt "
            "sets "
            "max_batch_size > 0, which adds a dynamic batch dimension",
            "set max_batch_size: 0 and list the full dims, or re-export the model with a dynamic batch axis",
            ev,
        )
    return Explained(
        f"{name}: the model's shape is {model_shape} but config.pbtxt declares a different "
        "shape" + (" (plus the batch dimension from max_batch_size > 0)" if batch else ""),
        "make dims in config.pbtxt match the model (with max_batch_size > 0 leave the batch dim out), "
        "or drop the input/output sections and let Triton auto-complete them",
        ev,
        R.CONFIG_INVALID if not batch else R.BATCH_DIM_CONFIG,
    )


def _frozen_axes(model_shape: str, config_shape: str) -> list[int]:
    """Axes (past axis 0) the model fixes to a size where the config's shape of the same rank has -1."""
    model = [int(x) for x in re.findall(r"-?\d+", model_shape)]
    config = [int(x) for x in re.findall(r"-?\d+", config_shape)]
    if len(model) != len(config):
        return []
    return [i for i, (a, b) in enumerate(zip(model, config, strict=True)) if i > 0 and a > 0 and b == -1]


_MAX_BATCH = 256  # the largest size axis 0 is read as a batch at
_NOT_A_BATCH = 10_000  # ... and a size on axis 0 no batch reaches (samples, tokens, buffer entries)


@_rule(
    "LOG006",
    "onnxruntime",
    "invalid dimensions for input",
    R.SHAPE_OR_RANK,
    r"Got invalid dimensions for input: (?P<input>\S+) for the following indices[\s>]*index: (?P<idx>\d+) Got: "
    r"(?P<got>\d+) Expected: (?P<exp>\d+)",
    also=(R.DYNAMIC_SHAPE_FIXED,),
)
def _ort_dims(m: re.Match[str]) -> Explained:
    idx, got, exp = int(m["idx"]), int(m["got"]), int(m["exp"])
    ev = {"input": m["input"], "index": idx, "got": got, "expected": exp}
    # axis 0 of a state/buffer input (sizes in the 10,000s) is no batch, whichever side holds them (196320 audio
    # samples sent without their batch axis to a model expecting 1: the rank is off, not a frozen batch)
    if idx == 0 and min(got, exp) <= _MAX_BATCH and max(got, exp) < _NOT_A_BATCH:
        return Explained(
            f"input {m['input']!r} has a fixed batch dimension {exp} in the ONNX graph but got {got}",
            "re-export with a dynamic batch axis (dynamic_axes={'" + m["input"] + "': {0: 'batch'}}) — "
            "run `usg doctor parity` to find what froze it — or send batches of exactly " + str(exp),
            ev,
            R.DYNAMIC_SHAPE_FIXED,
        )
    return Explained(  # a non-batch axis the model fixes: usually the client sends another size
        f"input {m['input']!r} dimension {idx} is fixed to {exp} in the ONNX graph but got {got}",
        f"resize/pad the input to {exp} on that axis, or re-export with axis {idx} dynamic",
        ev,
        R.SHAPE_OR_RANK,
    )


@_rule(
    "LOG007",
    "onnxruntime",
    "unexpected input data type",
    R.DTYPE_OR_RANGE,
    r"Unexpected input data type\.\s*Actual: \((?P<got>[^)]+\)?)\)\s*,\s*expected: \((?P<exp>[^)\n]+\)?)\)?",
)
def _ort_dtype(m: re.Match[str]) -> Explained:
    got, exp = m["got"], m["exp"]
    hint = " (numpy defaults to float64 / int64)" if "double" in got or "int64" in got else ""
    return Explained(
        f"ONNX Runtime got {got} but the input is {exp}{hint}",
        f"cast before run(): x.astype(np.{_np_name(exp)})",
        {"got": got, "expected": exp},
    )


def _np_name(ort_type: str) -> str:
    t = ort_type.replace("tensor(", "").rstrip(")")
    return {"float": "float32", "double": "float64", "float16": "float16"}.get(t, t)


@_rule(
    "LOG114",
    "onnx",
    "a tensor type the graph's operator does not take (ONNX type check)",
    R.DTYPE_OR_RANGE,
    # ONNX's type inference, as ONNX Runtime, onnx.checker and Triton's backends print it (a graph that fails it is
    # "an invalid model", but what is invalid is one tensor's element type at one operator)
    r"Type Error: Type '?(?P<t1>tensor\(\w+\))'? of input parameter \((?P<param>[^)\n]*)\)(?: of operator "
    r"\((?P<op>\w+)\)?)?(?: in node \((?P<node>[^)\n]*)\))?"
    r"|Type Error: Type parameter \((?P<tp>\w+)\)(?: of Optype \((?P<op2>\w+)\))? bound to different types "
    r"\((?P<a>tensor\(\w+\)) and (?P<b>tensor\(\w+\))\)? in node \((?P<node2>[^)\n]*)\)?"
    r"|Type Error: Type \((?P<t3>tensor\(\w+\))\) of output arg \((?P<out>[^)\n]*)\) of node \((?P<node3>[^)\n]*)\) "
    r"does not match expected type \((?P<exp3>tensor\(\w+\))\)",
)
def _onnx_type_check(m: re.Match[str]) -> Explained:
    if m["t1"]:
        node = f" in node {m['node']!r}" if m["node"] else ""
        what = f"operator {m['op'] or '(cut off)'}{node} does not take {m['t1']} for input {m['param']!r}"
        ev = {"operator": m["op"], "node": m["node"] or None, "type": m["t1"], "input": m["param"]}
    elif m["a"]:
        on = f" of {m['op2']}" if m["op2"] else ""
        what = f"type parameter {m['tp']}{on} gets both {m['a']} and {m['b']} in node {m['node2']!r}"
        ev = {"operator": m["op2"], "node": m["node2"], "types": [m["a"], m["b"]]}
    else:
        what = f"node {m['node3']!r} produces {m['t3']} for {m['out']!r} where {m['exp3']} is declared"
        ev = {"node": m["node3"], "type": m["t3"], "expected": m["exp3"], "output": m["out"]}
    return Explained(
        f"the ONNX graph's types do not check: {what} — an exporter or converter (fp16 conversion, a cast it "
        "dropped, a constant of another dtype) left a tensor of a type the operator's schema does not allow",
        "insert a Cast to a type the operator takes (or export with consistent dtypes: convert to fp16 with "
        "keep_io_types / an op block list, cast index tensors to int64), then check with onnx.checker.check_model("
        "model, full_check=True)",
        ev,
    )


@_rule(
    "LOG008",
    "onnxruntime",
    "invalid rank",
    R.SHAPE_OR_RANK,
    r"Invalid rank for input: (?P<input>\S+) Got: (?P<got>\d+) Expected: (?P<exp>\d+)",
)
def _ort_rank(m: re.Match[str]) -> Explained:
    got, exp = int(m["got"]), int(m["exp"])
    why = (
        " (missing batch dimension: add x[None])"
        if exp == got + 1
        else (" (extra dimension: squeeze it)" if got == exp + 1 else "")
    )
    return Explained(
        f"input {m['input']!r} has rank {got} but the model takes rank {exp}{why}",
        "reshape the input to the model's rank (np.expand_dims(x, 0) for a single item)",
        {"input": m["input"], "got_rank": got, "expected_rank": exp},
    )


@_rule(
    "LOG009",
    "onnxruntime",
    "no kernel for op",
    R.UNSUPPORTED_OP,
    # ONNX Runtime before 1.0: "for the node Mul(6)"; later: "for Mul(6) node with name '...'"
    r"Could not find an implementation for (?:the node )?(?P<op>\w+)\((?P<ver>\d+)\)"
    r"(?: node with name '(?P<node>[^']*)')?",
)
def _ort_kernel(m: re.Match[str]) -> Explained:
    node = f" (node {m['node']!r})" if m["node"] is not None else ""
    return Explained(
        f"this ONNX Runtime build has no kernel for {m['op']} (opset {m['ver']}) with these input types{node}",
        "upgrade onnxruntime, or re-export so the op gets a supported type (often float16/int8 → float32) or opset",
        {"op": m["op"], "opset": int(m["ver"]), "node": m["node"]},
    )


@_rule(
    "LOG010",
    "onnxruntime",
    "model newer than runtime",
    R.VERSION_COUPLING,
    r"(?:Unsupported model IR version: (?P<ir>\d+), max supported IR version:? ?(?P<maxir>\d+)?"
    r"|Opset (?P<opset>\d+) is under development and support for this is limited)",
)
def _ort_version(m: re.Match[str]) -> Explained:
    if m["ir"]:  # the maximum may be cut off in a pasted log
        top = m["maxir"] or "an older one"
        return Explained(
            f"the model has IR version {m['ir']} but this onnxruntime reads at most {top}",
            f"upgrade onnxruntime, or save the model with ir_version={m['maxir'] or '<the runtime maximum>'} "
            "(onnx.save after setting model.ir_version)",
            {"model_ir": int(m["ir"]), "max_ir": int(m["maxir"]) if m["maxir"] else None},
        )
    return Explained(
        f"the model uses opset {m['opset']}, newer than this onnxruntime fully supports",
        "upgrade onnxruntime or export with a lower opset_version",
        {"opset": int(m["opset"])},
    )


@_rule(
    "LOG011",
    "onnxruntime",
    "arena allocation failed",
    R.MEMORY,
    r"Failed to allocate memory for requested buffer of size (?P<size>\d+)",
)
def _ort_oom(m: re.Match[str]) -> Explained:
    size = int(m["size"])
    return Explained(
        f"ONNX Runtime could not allocate {size / 2**20:.1f} MiB",
        "lower the batch size / sequence length, set gpu_mem_limit or arena_extend_strategy=kSameAsRequested "
        "in the CUDA provider options, and check `usg plan` for the memory budget",
        {"bytes": size},
    )


@_rule(
    "LOG012",
    "pytorch",
    "CUDA out of memory",
    R.MEMORY,
    r"CUDA out of memory\. Tried to allocate (?P<want>[\d.]+ [KMGT]i?B)(?:.*?(?P<total>[\d.]+ [KMGT]i?B) "
    r"total capacity)?"
    r"(?:.*?(?P<free>[\d.]+ [KMGT]i?B) (?:is )?free)?",
)
def _cuda_oom(m: re.Match[str]) -> Explained:
    return Explained(
        f"CUDA ran out of memory allocating {m['want']}"
        + (f" ({m['free']} free of {m['total']})" if m["free"] and m["total"] else ""),
        "reduce batch size × sequence length, use float16/bfloat16, free cached tensors; for fragmentation "
        "set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        {"tried": m["want"], "free": m["free"], "total": m["total"]},
    )


@_rule(
    "LOG029",
    "triton",
    "request shape vs config shape",
    R.SHAPE_OR_RANK,
    r"unexpected shape for input '(?P<input>[^']+)' for model '(?P<model>[^']+)'\. Expected \[(?P<exp>[-\d, ]*)\], "
    r"got \[(?P<got>[-\d, ]*)\]",
    also=(R.BATCH_DIM_CONFIG,),
)
def _triton_shape(m: re.Match[str]) -> Explained:
    exp = [int(x) for x in m["exp"].split(",") if x.strip()]
    got = [int(x) for x in m["got"].split(",") if x.strip()]
    ev = {"input": m["input"], "model": m["model"], "expected": exp, "got": got}
    if len(exp) >= 2 and exp[0] == -1 and exp[1] == -1:
        return Explained(
            f"model {m['model']!r} expects two leading variable dims {exp} for {m['input']!r}: config.pbtxt dims "
            "repeat the batch dim that max_batch_size > 0 already adds",
            "remove the leading -1 from dims (Triton prepends the batch dim itself), or set max_batch_size: 0",
            ev,
            R.BATCH_DIM_CONFIG,
        )
    if len(exp) == len(got) + 1:
        return Explained(
            f"input {m['input']!r} was sent as {got} but model {m['model']!r} expects {exp}: the batch dim is missing",
            f"send shape [1, {', '.join(map(str, got))}] (add the batch dim), or set max_batch_size: 0 and "
            "declare the full shape",
            ev,
            R.BATCH_DIM_CONFIG,
        )
    return Explained(
        f"input {m['input']!r} was sent as {got} but model {m['model']!r} expects {exp}",
        "send the shape config.pbtxt declares (-1 dims are free); resize/pad on the client",
        ev,
    )


@_rule(
    "LOG064",
    "triton",
    "config tensor name the model does not have",
    R.CONFIG_INVALID,
    r"unexpected inference (?P<kind>input|output) '(?P<name>[^']+)', allowed (?:inputs|outputs) are: "
    r"(?P<allowed>[^\n|]*[^\s|])",
)
def _triton_io_name(m: re.Match[str]) -> Explained:
    allowed = [a.strip().strip("'\"") for a in m["allowed"].split(",") if a.strip()]
    model = re.search(r"failed to load '(?P<model>[^']+)'", m.string)
    kind = m["kind"]
    return Explained(
        f"config.pbtxt names {kind} {m['name']!r}, which the model file does not have (its {kind}s: "
        f"{', '.join(allowed)})" + (f" — model {model['model']!r}" if model else ""),
        f"rename the {kind} in config.pbtxt to the model's own name ({', '.join(allowed)}), or re-export the model "
        f"with the {kind} named {m['name']!r}",
        {"kind": kind, "name": m["name"], "allowed": allowed, "model": model["model"] if model else None},
    )


@_rule(
    "LOG065",
    "triton",
    "model directory without a version subdirectory",
    R.CONFIG_INVALID,
    r"(?:unable to autofill for '(?P<model>[^']+)' )?due to no version directories|"
    r"no version (?:sub)?director(?:y|ies) (?:found )?(?:for|in) (?:model )?'(?P<model2>[^']+)'",
)
def _no_version_dir(m: re.Match[str]) -> Explained:
    model = m["model"] or m["model2"]
    return Explained(
        "the model directory" + (f" of {model!r}" if model else "") + " has no numeric version subdirectory: "
        "Triton looks for the model file in <repository>/<model>/<version>/",
        "put the model file in a version directory (e.g. " + (model or "<model>") + "/1/model.onnx) next to "
        "config.pbtxt",
        {"model": model},
    )


from usg.doctor.logs import rules_compat, rules_engines, rules_limits, rules_openvino, rules_ray  # noqa: E402,F401  (register their rules)

import_module("usg.doctor.logs.rules_setup")  # devices, ports, PATH, listed values: before the cross-engine wording
import_module("usg.doctor.logs.rules_resources")  # placement groups, GPU features, pickled classes, profiles

import_module("usg.doctor.logs.rules_generic")  # cross-engine wording: after every engine's own rules
import_module("usg.doctor.logs.rules_drift")  # registers the drift rule last: a message other rules know stays theirs

RULES: tuple[LogRule, ...] = rules()


def codes() -> list[CodeInfo]:
    """One :class:`CodeInfo` per code (LOG000 included) for ``usg doctor --list-checks``."""
    seen: dict[str, CodeInfo] = {
        "LOG000": CodeInfo(
            "LOG000",
            Severity.ERROR,
            R.UNCLASSIFIED,
            "unclassified error line",
            "an error line no rule recognises; reported as is, never forced into a class",
        )
    }
    for r in RULES:
        info = seen.setdefault(r.code, CodeInfo(r.code, r.severity, r.root_cause, r.title, f"{r.system}: {r.title}"))
        extra = tuple(c for c in (r.root_cause, *r.also) if c not in info.root_causes())
        if extra:  # rules sharing a code, or refining its cause from the numbers in the message
            seen[r.code] = replace(info, also_root_causes=(*info.also_root_causes, *extra))
        if r.severity not in info.severities():
            raise RuntimeError(f"log rules for {r.code} disagree on the severity")
    return list(seen.values())
