"""The rules of ``usg doctor logs``: one regex per known error message, with what it means and the fix.

Patterns are written from messages users actually reported (Triton server/client, ONNX Runtime,
torch.onnx, TensorRT/trtexec, vLLM, transformers, CUDA). A rule's ``pattern`` must match on the
error line itself; it may read values from the next few lines (ONNX Runtime puts
``index: 0 Got: 32 Expected: 1`` below its head line). ``explain`` turns the match into the
message, the fix and the evidence; it may refine the root cause (a byte-size ratio of 4 is a
dtype problem, a ratio of 3 a layout problem).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from usg.doctor.findings import RootCause, Severity
from usg.doctor.registry import CodeInfo

__all__ = ["RULES", "Explained", "LogRule", "codes"]

R = RootCause


@dataclass(frozen=True)
class Explained:
    message: str
    fix: str
    evidence: dict[str, Any]
    root_cause: RootCause | None = None
    severity: Severity | None = None


@dataclass(frozen=True)
class LogRule:
    code: str
    system: str
    title: str
    root_cause: RootCause
    severity: Severity
    pattern: re.Pattern[str]
    explain: Callable[[re.Match[str]], Explained]


_RULES: list[LogRule] = []


def _rule(
    code: str, system: str, title: str, cause: RootCause, pattern: str, sev: Severity = Severity.ERROR
) -> Any:
    def deco(fn: Callable[[re.Match[str]], Explained]) -> Callable[[re.Match[str]], Explained]:
        _RULES.append(
            LogRule(code, system, title, cause, sev, re.compile(pattern, re.IGNORECASE | re.DOTALL), fn)
        )
        return fn

    return deco


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
    4: "uint8 (1 byte) data was sent where float32 (4 bytes) is expected: "
    "the image was not converted/normalised",
    2: "a 2-byte type was sent where a 4-byte one is expected (float16 vs float32, or int32 vs int64)",
    8: "uint8 data was sent where a float64/int64 input is expected",
    0.5: "a 4-byte type was sent where a 2-byte one is expected "
    "(float32 to a float16 input), or int64 to int32",
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
)
def _byte_size2(m: re.Match[str]) -> Explained:
    return _bytes_explain(int(m["exp"]), int(m["got"]), f"input {m['input']!r}")


@_rule(
    "LOG002",
    "triton",
    "input datatype mismatch",
    R.DTYPE_OR_RANGE,
    r"(?:unexpected datatype (?P<got>TYPE_\w+) for input '(?P<input>[^']+)', expecting (?P<exp>TYPE_\w+)"
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
    r"tensor '(?P<tensor>[^']+)': the model expects (?P<n>\d+) dimensions \(shape (?P<model>\[[^\]]*\])\) "
    r"but the model "
    r"configuration specifies (?P<m>\d+) dimensions(?P<rest>[^\n]*)",
)
def _config_dims(m: re.Match[str]) -> Explained:
    rest = m["rest"]
    batch = "max_batch_size > 0" in rest
    model_shape = m["model"]
    ev = {
        "tensor": m["tensor"],
        "model_shape": model_shape,
        "model_rank": int(m["n"]),
        "config_rank": int(m["m"]),
    }
    if batch and not model_shape.startswith("[-1"):
        return Explained(
            f"tensor {m['tensor']!r}: the model has a fixed first dimension {model_shape} but config.pbtxt "
            "sets "
            "max_batch_size > 0, which adds a dynamic batch dimension",
            "set max_batch_size: 0 and list the full dims, or re-export the model with a dynamic batch axis",
            ev,
        )
    return Explained(
        f"tensor {m['tensor']!r}: the model's shape is {model_shape} but config.pbtxt declares a different "
        "shape" + (" (plus the batch dimension from max_batch_size > 0)" if batch else ""),
        "make dims in config.pbtxt match the model (with max_batch_size > 0 leave the batch dim out), "
        "or drop the input/output sections and let Triton auto-complete them",
        ev,
        R.CONFIG_INVALID if not batch else R.BATCH_DIM_CONFIG,
    )


@_rule(
    "LOG006",
    "onnxruntime",
    "invalid dimensions for input",
    R.SHAPE_OR_RANK,
    r"Got invalid dimensions for input: (?P<input>\S+) for the following indices\s*index: (?P<idx>\d+) Got: "
    r"(?P<got>\d+) Expected: (?P<exp>\d+)",
)
def _ort_dims(m: re.Match[str]) -> Explained:
    idx, got, exp = int(m["idx"]), int(m["got"]), int(m["exp"])
    ev = {"input": m["input"], "index": idx, "got": got, "expected": exp}
    if idx == 0:
        return Explained(
            f"input {m['input']!r} has a fixed batch dimension {exp} in the ONNX graph but got {got}",
            "re-export with a dynamic batch axis (dynamic_axes={'" + m["input"] + "': {0: 'batch'}}) — "
            "run `usg doctor parity` to find what froze it — or send batches of exactly " + str(exp),
            ev,
            R.DYNAMIC_SHAPE_FIXED,
        )
    return Explained(
        f"input {m['input']!r} dimension {idx} is fixed to {exp} in the ONNX graph but got {got}",
        f"resize/pad the input to {exp} on that axis, or re-export with axis {idx} dynamic",
        ev,
        R.DYNAMIC_SHAPE_FIXED,
    )


@_rule(
    "LOG007",
    "onnxruntime",
    "unexpected input data type",
    R.DTYPE_OR_RANGE,
    r"Unexpected input data type\. Actual: \((?P<got>[^)]+\)?)\)\s*,\s*expected: \((?P<exp>[^)]+\)?)\)",
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
    r"Could not find an implementation for (?P<op>\w+)\((?P<ver>\d+)\) node with name '(?P<node>[^']*)'",
)
def _ort_kernel(m: re.Match[str]) -> Explained:
    return Explained(
        f"this ONNX Runtime build has no kernel for {m['op']} (opset {m['ver']}) with these input types "
        f"(node {m['node']!r})",
        "upgrade onnxruntime, or re-export so the op gets a supported type (often float16/int8 → float32) or "
        "opset",
        {"op": m["op"], "opset": int(m["ver"]), "node": m["node"]},
    )


@_rule(
    "LOG010",
    "onnxruntime",
    "model newer than runtime",
    R.VERSION_COUPLING,
    r"(?:Unsupported model IR version: (?P<ir>\d+), max supported IR version: (?P<maxir>\d+)"
    r"|Opset (?P<opset>\d+) is under development and support for this is limited)",
)
def _ort_version(m: re.Match[str]) -> Explained:
    if m["ir"]:
        return Explained(
            f"the model has IR version {m['ir']} but this onnxruntime reads at most {m['maxir']}",
            f"upgrade onnxruntime, or save the model with ir_version={m['maxir']} (onnx.save after setting "
            "model.ir_version)",
            {"model_ir": int(m["ir"]), "max_ir": int(m["maxir"])},
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
    "LOG013",
    "torch.onnx",
    "operator not supported at opset",
    R.UNSUPPORTED_OP,
    r"Exporting the operator '?(?P<op>[\w:.]+)'? to ONNX opset version (?P<opset>\d+) is not supported"
    r"(?:\.\s*Support for this operator was added in version (?P<added>\d+))?",
)
def _onnx_op(m: re.Match[str]) -> Explained:
    ev: dict[str, Any] = {"operator": m["op"], "opset": int(m["opset"])}
    if m["added"]:
        ev["opset_with_support"] = int(m["added"])
        return Explained(
            f"{m['op']} cannot be exported at opset {m['opset']}; it is supported from opset {m['added']}",
            f"export with opset_version={m['added']} (or newer) — check your runtime supports that opset",
            ev,
        )
    return Explained(
        f"{m['op']} has no ONNX symbolic at opset {m['opset']} in the legacy exporter",
        "export with the dynamo exporter (torch.onnx.export(..., dynamo=True)), register a custom symbolic, "
        "or replace the call",
        ev,
    )


@_rule(
    "LOG014",
    "torch.onnx",
    "trace froze a value",
    R.DYNAMIC_SHAPE_FIXED,
    r"TracerWarning: (?P<what>Converting a tensor to a Python (?:integer|index|boolean|float)|torch\.tensor "
    r"results are registered as constants"
    r"|Iterating over a tensor)",
    Severity.WARNING,
)
def _tracer(m: re.Match[str]) -> Explained:
    return Explained(
        f"the tracer recorded a value as a constant ({m['what']}): the exported graph is frozen at the "
        "export shape",
        "keep sizes as tensors (x.shape[0] without int()/len()), then run `usg doctor parity` at other "
        "batch/seq sizes",
        {"warning": m["what"]},
    )


@_rule(
    "LOG015",
    "torch.onnx",
    "dynamo exporter: no ONNX function",
    R.UNSUPPORTED_OP,
    r"No (?:ONNX function|decompositions?) (?:found|registered) for (?:<OpOverload\(op=')?(?P<op>[\w.:]+)",
)
def _dynamo_op(m: re.Match[str]) -> Explained:
    return Explained(
        f"the dynamo exporter has no ONNX translation for {m['op']}",
        "pass custom_translation_table={...} with an onnxscript function, or export with dynamo=False",
        {"operator": m["op"]},
    )


@_rule(
    "LOG016",
    "tensorrt",
    "no implementation for node",
    R.UNSUPPORTED_OP,
    r"Could not find any implementation for node (?P<node>.+?)(?:\.\)|\)|, try|$)",
)
def _trt_impl(m: re.Match[str]) -> Explained:
    node = m["node"].strip()
    ws = "workspace" in m.string.lower() or "insufficient" in m.string.lower()
    return Explained(
        f"TensorRT found no tactic for {node}" + (" within the workspace limit" if ws else ""),
        "raise the builder workspace (trtexec --memPoolSize=workspace:4096M / config.set_memory_pool_limit); "
        "if that does not help, the layer's precision/shape is unsupported: build without --fp16/--int8 for "
        "that layer or upgrade TensorRT",
        {"node": node, "workspace_hint": ws},
        R.MEMORY if ws else None,
    )


@_rule(
    "LOG017",
    "tensorrt",
    "unsupported ONNX data type",
    R.DTYPE_OR_RANGE,
    r"Unsupported ONNX data type: (?P<dtype>\w+)(?: \((?P<code>\d+)\))?",
)
def _trt_dtype(m: re.Match[str]) -> Explained:
    dt = m["dtype"].upper()
    fix = (
        "cast the input to int32 in the exporter (TensorRT < 10 has no INT64 inputs) and send int32"
        if dt == "INT64"
        else f"cast {dt} tensors to a TensorRT type (float32/float16/int32) before export"
    )
    return Explained(f"the TensorRT ONNX parser does not support {dt} tensors", fix, {"dtype": dt})


@_rule(
    "LOG018",
    "tensorrt",
    "INT64 weights cast down",
    R.DTYPE_OR_RANGE,
    r"Your ONNX model has been generated with INT64 weights, while TensorRT does not natively support INT64",
    Severity.WARNING,
)
def _trt_int64(m: re.Match[str]) -> Explained:
    return Explained(
        "TensorRT casts INT64 weights to INT32; values above 2^31 (e.g. INT64_MAX in Slice ends) are clamped",
        "usually harmless; if outputs differ, fold constants (polygraphy surgeon sanitize --fold-constants) "
        "or export int32 indices",
        {},
    )


@_rule(
    "LOG019",
    "tensorrt",
    "no importer for op",
    R.UNSUPPORTED_OP,
    r"(?:No importer registered for op: (?P<op>\w+)|getPluginCreator could not find plugin:? "
    r"(?P<plugin>\w+))",
)
def _trt_op(m: re.Match[str]) -> Explained:
    op = m["op"] or m["plugin"]
    return Explained(
        f"the TensorRT ONNX parser cannot import op {op}",
        "upgrade TensorRT, export with an opset whose form of the op TensorRT supports, or provide a plugin",
        {"op": op},
    )


@_rule(
    "LOG020",
    "tensorrt",
    "shapes not provided for dynamic input",
    R.DYNAMIC_SHAPE_FIXED,
    r"Dynamic dimensions required for input: (?P<input>\S+?),? but no shapes were provided\. Automatically "
    r"overriding shape to: (?P<shape>[\dx]+)",
    Severity.WARNING,
)
def _trt_override(m: re.Match[str]) -> Explained:
    shape = m["shape"]
    return Explained(
        f"trtexec built the engine for input {m['input']!r} at the single shape {shape}: the engine is not "
        "dynamic",
        f"pass --minShapes/--optShapes/--maxShapes for {m['input']} (e.g. batch 1..N) when building",
        {"input": m["input"], "shape": shape},
        R.BATCH_DIM_CONFIG if shape.startswith("1x") else None,
    )


@_rule(
    "LOG021",
    "vllm",
    "max seq len exceeds KV cache",
    R.MEMORY,
    r"max seq len \((?P<seq>\d+)\) is larger than the maximum number of tokens that can be stored in KV "
    r"cache \((?P<kv>\d+)\)",
)
def _vllm_kv(m: re.Match[str]) -> Explained:
    seq, kv = int(m["seq"]), int(m["kv"])
    return Explained(
        f"max_model_len {seq} needs more KV cache than fits: only {kv} tokens fit ({kv / seq:.0%} of one "
        "full sequence)",
        f"set max_model_len <= {kv}, raise gpu_memory_utilization, use a quantised KV cache "
        "(kv_cache_dtype=fp8) "
        "or more tensor parallelism",
        {"max_seq_len": seq, "kv_cache_tokens": kv},
    )


@_rule("LOG022", "vllm", "no memory for cache blocks", R.MEMORY, r"No available memory for the cache blocks")
def _vllm_blocks(m: re.Match[str]) -> Explained:
    return Explained(
        "after loading the weights and profiling activations no GPU memory is left for the KV cache",
        "raise gpu_memory_utilization, lower max_num_seqs / max_num_batched_tokens / max_model_len, "
        "or use a smaller/quantised model (check `usg plan`)",
        {},
    )


@_rule(
    "LOG023",
    "transformers",
    "image tokens vs image features",
    R.VERSION_COUPLING,
    r"Image features and image tokens do not match:? tokens:? (?P<tok>\d+),? features:? (?P<feat>\d+)",
)
def _vlm(m: re.Match[str]) -> Explained:
    tok, feat = int(m["tok"]), int(m["feat"])
    ev = {"image_tokens": tok, "image_features": feat, "difference": tok - feat}
    if tok - feat == 1:
        why, fix = (
            "one more token than features: the processor counts a CLS token the tower does not emit "
            "(SigLIP has no CLS) or the strategy drops one",
            "num_additional_image_tokens=0 and vision_feature_select_strategy='full' for SigLIP towers; "
            "check with `usg doctor <model dir>`",
        )
    elif feat - tok == 1:
        why, fix = (
            "one more feature than tokens: the CLS token is kept by the model but not counted by the "
            "processor",
            "set num_additional_image_tokens=1 (CLIP) or vision_feature_select_strategy='default' "
            "consistently",
        )
    elif feat and tok and tok < feat:
        why, fix = (
            "fewer tokens than features: the prompt was truncated (max_length) or the processor uses another "
            "image size",
            "do not truncate prompts with images (truncation=False / larger max_length); align the "
            "processor's size",
        )
    else:
        why, fix = (
            "the processor and the model compute different token counts per image",
            "use the processor saved with this model; compare patch_size / image size / merge size",
        )
    return Explained(
        f"the prompt has {tok} image tokens but the vision tower produced {feat} features: {why}", fix, ev
    )


@_rule(
    "LOG024",
    "transformers",
    "sequence longer than model max",
    R.SHAPE_OR_RANK,
    r"Token indices sequence length is longer than the specified maximum sequence length for this model "
    r"\((?P<got>\d+) > (?P<max>\d+)\)",
    Severity.WARNING,
)
def _hf_len(m: re.Match[str]) -> Explained:
    return Explained(
        f"a tokenized input has {m['got']} tokens but the model accepts {m['max']}: running it will index "
        "past the position embeddings",
        f"tokenize with truncation=True, max_length={m['max']} (or chunk the text)",
        {"tokens": int(m["got"]), "max_length": int(m["max"])},
    )


@_rule(
    "LOG025",
    "vllm",
    "prompt longer than max model length",
    R.SHAPE_OR_RANK,
    r"(?:decoder )?prompt \(length (?P<got>\d+)\) is longer than the maximum model length of (?P<max>\d+)",
)
def _vllm_len(m: re.Match[str]) -> Explained:
    return Explained(
        f"the prompt has {m['got']} tokens but max_model_len is {m['max']}",
        "truncate/shorten the prompt on the client or raise max_model_len (if the KV cache allows)",
        {"prompt_tokens": int(m["got"]), "max_model_len": int(m["max"])},
    )


@_rule(
    "LOG026",
    "pytorch",
    "input/weight dtype mismatch",
    R.DTYPE_OR_RANGE,
    r"(?:Input type \((?P<inp>[\w.]+)\) and weight type \((?P<w>[\w.]+)\) should be the same"
    r"|expected (?:scalar type|m1 and m2 to have the same dtype, but got:?) (?P<a>\w+)(?: but found| !=) "
    r"(?P<b>\w+))",
)
def _torch_dtype(m: re.Match[str]) -> Explained:
    a, b = m["inp"] or m["a"], m["w"] or m["b"]
    return Explained(
        f"a tensor of type {a} meets weights/tensors of type {b}",
        "cast inputs to the model's dtype/device (x.to(model.dtype).to(model.device)) or load the model in "
        "the input's dtype",
        {"input_type": a, "weight_type": b},
    )


@_rule(
    "LOG027",
    "cuda",
    "driver/runtime or library mismatch",
    R.ENVIRONMENT,
    r"(?:CUDA driver version is insufficient for CUDA runtime version"
    r"|(?P<lib>lib(?:cudnn|cublas\w*|cudart|nvinfer\w*|cufft)\.so[.\d]*): cannot open shared object file"
    r"|CUDAExecutionProvider is not in available provider names)",
)
def _cuda_env(m: re.Match[str]) -> Explained:
    lib = m["lib"]
    return Explained(
        f"the CUDA environment does not match the binaries: {m.group(0)}",
        (
            f"install the CUDA/cuDNN version your onnxruntime-gpu/torch wheel was built for so {lib} is "
            "found "
            "(LD_LIBRARY_PATH), or pick the wheel matching your CUDA"
        )
        if lib
        else "update the NVIDIA driver or install a build for the installed CUDA version; "
        "for ORT install onnxruntime-gpu",
        {"library": lib} if lib else {},
    )


@_rule(
    "LOG028",
    "tensorrt",
    "engine build aborted (consequence)",
    R.UNCLASSIFIED,
    r"(?:Engine could not be created from network|Building engine failed|Engine set up failed"
    r"|Assertion enginePtr != nullptr failed|&&&& FAILED TensorRT)",
    Severity.WARNING,
)
def _trt_aborted(m: re.Match[str]) -> Explained:
    return Explained(
        "the TensorRT build stopped; these lines follow from an earlier error, not a cause of their own",
        "fix the first [E] line before them (run trtexec with --verbose if there is none)",
        {"consequence_of_earlier_error": True},
    )


RULES: tuple[LogRule, ...] = tuple(_RULES)


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
        seen.setdefault(r.code, CodeInfo(r.code, r.severity, r.root_cause, r.title, f"{r.system}: {r.title}"))
    return list(seen.values())
