"""Log rules for exporters and engines: torch.onnx, TensorRT, vLLM, transformers, CUDA set-up.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (after the runtime rules).
"""

from __future__ import annotations

import math
import re
from typing import Any

from usg.doctor.findings import Severity
from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []


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
    "LOG013",
    "torch.onnx",
    "operator the exporter cannot write",
    R.UNSUPPORTED_OP,
    r"ONNX export failed:? Couldn't export (?P<python>Python )?operator (?P<op>[\w:.]+)",
)
def _onnx_op_export_failed(m: re.Match[str]) -> Explained:
    if m["python"]:  # a torch.autograd.Function the exporter sees as an opaque Python op
        return Explained(
            f"{m['op']} is a Python autograd Function the ONNX exporter cannot see into",
            f"give {m['op']} a symbolic() static method (or register a custom op), or rewrite it with torch ops",
            {"operator": m["op"], "python_op": True},
        )
    return Explained(
        f"the ONNX exporter has no symbolic for {m['op']}",
        "export with a newer opset or PyTorch (the dynamo exporter), register a custom symbolic, or replace the call",
        {"operator": m["op"]},
    )


@_rule(
    "LOG014",
    "torch.onnx",
    "trace froze a value",
    R.DYNAMIC_SHAPE_FIXED,
    r"TracerWarning: (?P<what>Converting a tensor to a Python (?:integer|index|boolean|float|number)"
    r"|Using len to get tensor shape|torch\.tensor "
    r"results are registered as constants"
    r"|Iterating over a tensor)",
    Severity.WARNING,
)
def _tracer(m: re.Match[str]) -> Explained:
    return Explained(
        f"the tracer recorded a value as a constant ({m['what']}): the exported graph is frozen at the export shape",
        "keep sizes as tensors (x.shape[0] without int()/len()), then run `usg doctor parity` at other batch/seq sizes",
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
    R.UNCLASSIFIED,
    r"Could not find any implementation for node (?P<node>.+?)(?:\.\)|\)|, try|$)",
    also=(R.MEMORY,),
)
def _trt_impl(m: re.Match[str]) -> Explained:
    """TensorRT found no tactic for a node. The message has several causes that it does not name itself (a
    workspace too small for the tactics, a driver or TensorRT release too old for the GPU, a layer with no kernel
    in the requested precision): only the memory wording beside it names one; otherwise it stays unclassified."""
    node = m["node"].strip()
    ws = "workspace" in m.string.lower() or "insufficient" in m.string.lower()
    if ws:
        return Explained(
            f"TensorRT found no tactic for {node} within the workspace limit",
            "raise the builder workspace (trtexec --memPoolSize=workspace:4096M / config.set_memory_pool_limit)",
            {"node": node, "workspace_hint": True},
            R.MEMORY,
        )
    return Explained(
        f"TensorRT found no tactic for {node}; the message alone does not say why (too little workspace or "
        "device memory, a driver/TensorRT release too old for this GPU, or a layer with no kernel in the "
        "requested precision)",
        "look for [W] lines about skipped tactics or insufficient memory above it (then raise the workspace: "
        "trtexec --memPoolSize=workspace:4096M); otherwise update the driver and TensorRT, and build the layer "
        "without --fp16/--int8",
        {"node": node, "workspace_hint": False, "possible_causes": ["memory", "version_coupling", "unsupported_op"]},
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
    r"(?P<plugin>\w+)"
    # TensorRT 8.5+: an op with no importer falls back to a plugin of its name, and no such plugin is registered
    r"|(?:importFallbackPluginImporter|creator && \")[^\n]{0,80}\n?[^\n]{0,80}?Plugin not found)",
)
def _trt_op(m: re.Match[str]) -> Explained:
    op = m["op"] or m["plugin"]
    if op is None:  # the fallback: the op's name is on the parser's "While parsing node number N [Op -> ...]" line
        return Explained(
            "the TensorRT ONNX parser has no importer for an op of this model and no plugin of its name is registered",
            "upgrade TensorRT, export with an opset whose form of the op TensorRT supports, or register a plugin "
            "for the op (the parser's 'While parsing node' line names it)",
            {"op": None},
        )
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
    also=(R.BATCH_DIM_CONFIG,),
)
def _trt_override(m: re.Match[str]) -> Explained:
    shape = m["shape"]
    return Explained(
        f"trtexec built the engine for input {m['input']!r} at the single shape {shape}: the engine is not dynamic",
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
    R.CONFIG_INVALID,
    r"Image features and image tokens do not match[:,]? tokens:? (?P<tok>\d+),? features:? (?P<feat>\d+)",
    also=(R.VERSION_COUPLING, R.SHAPE_OR_RANK),
)
def _vlm(m: re.Match[str]) -> Explained:
    tok, feat = int(m["tok"]), int(m["feat"])
    ev = {"image_tokens": tok, "image_features": feat, "difference": tok - feat}
    if tok == 0 and feat:
        return Explained(
            f"the prompt has no image token but the vision tower produced {feat} features: the prompt was built "
            "without the image placeholder",
            "build the prompt with the processor's chat template (apply_chat_template) or put the model's image "
            "token (e.g. <image>) in the text for every image",
            ev,
            R.CONFIG_INVALID,
        )
    if tok == 1 and feat > 1:
        return Explained(
            f"the prompt has a single image token for {feat} image features: the processor did not expand the image "
            "placeholder (its legacy path, taken when the processor config lacks patch_size / "
            "num_additional_image_tokens / vision_feature_select_strategy — model files older than this transformers)",
            "use the processor files saved for this transformers release (re-download the model's "
            "processor_config.json) or set processor.patch_size, num_additional_image_tokens and "
            "vision_feature_select_strategy from the model's config",
            ev,
            R.VERSION_COUPLING,
        )
    # Off by one (or any count the numbers alone cannot explain): the prompt and the processor settings
    # disagree with the tower — a setting to correct (a CLS token counted on one side only, a hand-built
    # prompt or hand-resized image), not evidence of a version mismatch. Only "one token for N features"
    # above names the processor's legacy path, i.e. model files older than the library.
    if tok - feat == 1 and any(math.isqrt(n) ** 2 == n for n in (tok, feat)):
        why, fix = (  # off by one from one image's square patch grid: a CLS token counted on one side only
            "one more token than features: the processor counts a CLS token the tower does not emit "
            "(SigLIP has no CLS) or the strategy drops one",
            "num_additional_image_tokens=0 and vision_feature_select_strategy='full' for SigLIP towers; "
            "check with `usg doctor <model dir>`",
        )
    elif tok > feat:
        return Explained(
            f"the text has {tok - feat} image token(s) more than the images produce ({tok} tokens, {feat} features): "
            "a sample carries an extra or misplaced image placeholder (conversation format), or generated text "
            "contains the image token (RL rollouts feeding generations back)",
            "check the failing sample's format (one <image> per image, where the template expects it) and strip the "
            "image token id from generated ids; if every sample is off by one per image, the processor counts a CLS "
            "token the tower lacks (SigLIP: num_additional_image_tokens=0)",
            ev,
            R.CONFIG_INVALID,
        )
    elif feat - tok == 1:
        why, fix = (
            "one more feature than tokens: the prompt carries one image token fewer than the tower's patches — "
            "the CLS token is kept by the model but not counted by the processor, or the prompt was built by "
            "hand (own chat template, image resized outside the processor)",
            "build the prompt with the processor (apply_chat_template, processor(images=...)); otherwise set "
            "num_additional_image_tokens=1 (CLIP) or vision_feature_select_strategy='default' consistently",
        )
    elif feat and tok and tok < feat:
        return Explained(
            f"the prompt has {tok} image tokens but the vision tower produced {feat} features: fewer tokens than "
            "features: the prompt was truncated (max_length) or the processor uses another image size",
            "do not truncate prompts with images (truncation=False / larger max_length); align the processor's size",
            ev,
            R.SHAPE_OR_RANK,
        )
    else:
        why, fix = (
            "the processor and the model compute different token counts per image",
            "use the processor saved with this model; compare patch_size / image size / merge size",
        )
    return Explained(f"the prompt has {tok} image tokens but the vision tower produced {feat} features: {why}", fix, ev)


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
    r"|Assertion engine(?:Ptr)? != nullptr failed|&&&& FAILED TensorRT)",
    Severity.WARNING,
)
def _trt_aborted(m: re.Match[str]) -> Explained:
    return Explained(
        "the TensorRT build stopped; these lines follow from an earlier error, not a cause of their own",
        "fix the first [E] line before them (run trtexec with --verbose if there is none)",
        {"consequence_of_earlier_error": True},
    )


@_rule(
    "LOG030",
    "ray_serve",
    "replicas cannot be scheduled",
    R.CONFIG_INVALID,
    r"Deployment '?\"?(?P<dep>[^'\" ]+)'?\"?.*?has (?P<n>\d+) replicas? that ha(?:ve|s) taken more than (?P<s>\d+)s "
    r"to be scheduled.*?Resources required for each replica: (?P<need>\{[^}]*\}), (?:total )?resources available: "
    r"(?P<have>\{[^}]*\})",
    Severity.WARNING,
)
def _ray_sched(m: re.Match[str]) -> Explained:
    return Explained(
        f"deployment {m['dep']!r}: {m['n']} replica(s) wait to be scheduled; each needs {m['need']} but the cluster "
        f"offers {m['have']} (no single node may fit it)",
        "lower ray_actor_options (num_cpus/num_gpus) per replica, add nodes of the right shape, or check that "
        "the autoscaler has a node type that fits one replica",
        {"deployment": m["dep"], "required": m["need"], "available": m["have"]},
    )


@_rule(
    "LOG031",
    "triton",
    "Python backend stub died",
    R.ENVIRONMENT,
    r"Stub process (?:'(?P<inst>[^']+)' )?is (?:not healthy|unhealthy)|Failed to initialize stub",
)
def _stub(m: re.Match[str]) -> Explained:
    return Explained(
        "the Python backend's stub process died or hung" + (f" ({m['inst']})" if m["inst"] else ""),
        "give the container enough shared memory (--shm-size, or --ipc=host), keep heavy imports inside "
        "initialize(), and read the model.py traceback above for a crash",
        {"instance": m["inst"]},
    )


@_rule(
    "LOG032",
    "tensorrt",
    "tactics skipped for lack of memory",
    R.MEMORY,
    r"(?:Some tactics do not have sufficient workspace memory|Skipping tactic \S+ due to insuff?icient memory"
    r"|Device memory is insufficient to use tactic)",
    Severity.WARNING,
)
def _tactic_mem(m: re.Match[str]) -> Explained:
    return Explained(
        "TensorRT skipped tactics because the workspace / free GPU memory is too small (the engine builds, "
        "maybe slower)",
        "raise the workspace (setMemoryPoolLimit / --memPoolSize) if memory is free, or free the GPU; keep it "
        "below the free memory",
        {},
    )


@_rule(
    "LOG033",
    "vllm",
    "dtype not supported by the GPU",
    R.ENVIRONMENT,
    r"Bfloat16 is only supported on GPUs with compute capability of at least (?P<need>\d+(?:\.\d+)?)\.?\s*Your "
    r"(?P<gpu>.+?)\s*GPU has compute capability (?P<have>\d+(?:\.\d+)?)",
)
def _bf16(m: re.Match[str]) -> Explained:
    return Explained(
        f"the {m['gpu'].strip()} (compute capability {m['have']}) has no bfloat16; the model asks for it "
        f"(needs >= {m['need']})",
        "serve in float16: --dtype half (vLLM) / dtype='half', or use a GPU with compute capability >= 8.0",
        {"gpu": m["gpu"].strip(), "compute_capability": m["have"], "required": m["need"]},
    )


@_rule(
    "LOG070",
    "tensorrt_llm",
    "engine plugin fields of another TensorRT-LLM build",
    R.VERSION_COUPLING,
    r"Assertion failed: d == a \+ length \((?P<file>[^)\n]*?plugins/(?P<plugin>\w+)/[^)\n:]+):?(?P<line>\d+)?",
)
def _plugin_layout(m: re.Match[str]) -> Explained:
    return Explained(
        f"the engine's {m['plugin']} plugin was serialized with another field layout than this TensorRT-LLM build "
        "reads: the engine was built by another TensorRT-LLM version than the runtime (or Triton backend) loading it",
        "rebuild the engine with the TensorRT-LLM version of the runtime / tensorrtllm_backend image (see its "
        "support matrix), or run the runtime version that built it",
        {"plugin": m["plugin"], "source": m["file"]},
    )


@_rule(
    "LOG077",
    "triton",
    "model directory without a usable configuration",
    R.CONFIG_INVALID,
    r"(?:Poll failed for\s+model directory '(?P<dir>[^'\n]*)':\s+)?"
    r"(?:failed to open text file for read (?P<path>[^\s:]*config\.pbtxt):? No such file"
    r"|(?:Invalid model name:\s+)?Could not determine backend\s+for model '(?P<model>[^'\n]*)' with no backend)",
)
def _triton_no_config(m: re.Match[str]) -> Explained:
    if m["path"]:
        return Explained(
            f"the model directory has no config.pbtxt ({m['path']}) and the server does not generate one for it",
            "add config.pbtxt to the model directory (platform/backend, inputs, outputs), or start the server with "
            "auto-complete of the configuration (--disable-auto-complete-config off / --strict-model-config=false) "
            "for a backend that can derive it from the model file",
            {"model_directory": m["dir"], "config_path": m["path"]},
        )
    return Explained(
        f"the configuration of model {m['model']!r} names neither a backend nor a platform, and the model name does "
        "not say one ('model.<backend>')",
        'set backend (e.g. backend: "onnxruntime", "python") or platform in config.pbtxt',
        {"model_directory": m["dir"], "model": m["model"]},
    )


@_rule(
    "LOG078",
    "triton",
    "request shape outside the TensorRT engine's profile",
    R.DYNAMIC_SHAPE_FIXED,
    r"(?:trt )?failed to set binding dimension to \[(?P<dims>[-\d, ]+)\] for input '(?P<input>[^'\n]+)'"
    r"|(?P<runtime>Runtime dimension does not satisfy any optimization profile)"
    # TensorRT-LLM's Python runtime: "Couldn't assign past_key_value_0 with shape torch.Size([...]), engine supports
    # [min, opt, max] = [...]"
    r"|Couldn't assign (?P<input2>\w+) with shape (?:torch\.Size\()?\[?(?P<dims2>[-\d, ]+)\]?\)?,? engine supports"
    # ... and its C++ runtime: "Tensor 'input_ids' has invalid shape (8192), expected in range min (1), max (4096)"
    r"|Tensor '(?P<input3>\w+)' has invalid shape \((?P<dims3>[-\d, ]+)\), expected in range min",
)
def _trt_binding(m: re.Match[str]) -> Explained:
    if m["input2"] or m["input3"]:
        dims2 = [int(d) for d in (m["dims2"] or m["dims3"]).replace(" ", "").split(",") if d]
        return Explained(
            f"the TensorRT-LLM engine does not take {m['input2'] or m['input3']!r} with shape {dims2}: the shape is "
            "outside the range its optimization profile was built for (max batch size, input/output or sequence "
            "lengths)",
            "rebuild the engine with limits covering the request (trtllm-build --max_batch_size/--max_input_len/"
            "--max_seq_len), or keep requests inside the limits it was built with",
            {"input": m["input2"] or m["input3"], "shape": dims2},
        )
    if m["runtime"]:  # TensorRT 8.5+'s setInputShape: no shape in the message
        return Explained(
            "an input shape set at run time is outside every optimization profile the TensorRT engine was built with",
            "build the engine with profiles covering the shapes sent (trtexec --minShapes/--optShapes/--maxShapes; "
            "for TensorRT-LLM the build's max input/output lengths and batch size), or keep requests inside them",
            {"input": None, "shape": None},
        )
    dims = [int(d) for d in m["dims"].replace(" ", "").split(",") if d]
    return Explained(
        f"the TensorRT engine does not take input {m['input']!r} with shape {dims}: the shape is outside the "
        "engine's optimization profile (or the engine was built with fixed shapes)",
        "build the engine with a profile covering this shape (trtexec --minShapes/--optShapes/--maxShapes), or "
        "send shapes (and a max_batch_size) inside the profile it was built with",
        {"input": m["input"], "shape": dims},
    )


@_rule(
    "LOG079",
    "llm server",
    "context length beyond the model's",
    R.CONFIG_INVALID,
    r"User-specified (?P<key>max_model_len|context_length|max_seq_len) \((?P<user>\d+)\) is greater than the "
    r"derived (?:max_model_len|context_length|max_seq_len) \((?P<derived>[^)\n]*)\)",
)
def _context_beyond_model(m: re.Match[str]) -> Explained:
    limit = re.findall(r"\d+", m["derived"])
    return Explained(
        f"{m['key']} {m['user']} is longer than the context the model's config.json declares ({m['derived']})",
        f"set {m['key']} to at most the model's context{f' ({limit[-1]})' if limit else ''}, or use a model "
        "(or rope scaling) made for the longer context; overriding the check risks wrong outputs",
        {m["key"]: int(m["user"]), "model_context": int(limit[-1]) if limit else None, "derived": m["derived"]},
    )


@_rule(
    "LOG080",
    "optimum",
    "exporter has no configuration for the architecture",
    R.UNSUPPORTED_OP,
    r"Trying to export a (?P<model_type>[\w.-]+) model, that is a custom or unsupported architecture"
    r"|Tried to use ORTOptimizer for the model type (?P<opt_type>[\w.-]+), but it is not available yet",
)
def _exporter_architecture(m: re.Match[str]) -> Explained:
    if m["opt_type"]:
        return Explained(
            f"optimum's ONNX Runtime optimizer has no support for model type {m['opt_type']!r}",
            "export without graph optimization (or optimize with onnxruntime.transformers.optimizer directly), or use "
            "an optimum release that supports the model type if one does",
            {"model_type": m["opt_type"]},
        )
    return Explained(
        f"the exporter has no export configuration for model type {m['model_type']!r} (a custom or unsupported "
        "architecture)",
        "pass a custom export configuration for it (custom_onnx_configs / custom_export_configs), or use a release "
        "of the exporter that supports the architecture if one does",
        {"model_type": m["model_type"]},
    )


@_rule(
    "LOG083",
    "tensorrt",
    "batch larger than the implicit-batch engine's maximum",
    R.BATCH_DIM_CONFIG,
    r"Batch size was: (?P<got>\d+), but engine max batch size was: (?P<max>\d+)"
    r"|condition: batchSize > 0 &&\s*batchSize <= mEngine\.getMaxBatchSize\(\)"
    r"(?:\.? ?Note: Batch size was: (?P<got2>\d+), but engine max batch size was: (?P<max2>\d+))?"
    # Triton's TensorRT backend: config.pbtxt's max_batch_size above the plan's
    r"|unexpected configuration maximum batch size (?P<got3>\d+) for '[^'\n]*', model maximum is (?P<max3>\d+)",
)
def _implicit_batch(m: re.Match[str]) -> Explained:
    got, top = m["got"] or m["got2"] or m["got3"], m["max"] or m["max2"] or m["max3"]
    sizes = f" ({got} sent, the engine takes at most {top})" if got else ""
    return Explained(
        f"the batch is larger than the maximum batch size the (implicit-batch) TensorRT engine was built with{sizes}",
        "rebuild the engine with a larger max batch size (or an explicit-batch engine with a profile covering the "
        "batch), or send smaller batches (Triton: max_batch_size in config.pbtxt no larger than the engine's)",
        {"batch": int(got) if got else None, "engine_max_batch": int(top) if top else None},
    )


@_rule(
    "LOG084",
    "tensorrt-llm",
    "engine and runtime from different TensorRT-LLM releases (engine tensors)",
    R.VERSION_COUPLING,
    r"The following expected tensors are not found:? ?(?P<tensors>\{[^}\n]{0,200})?"
    r"|Input tensor '(?P<tensor>\w+)' not found; expected shape",
)
def _engine_tensors(m: re.Match[str]) -> Explained:
    names = re.findall(r"'(\w+)'", m["tensors"] or "") or ([m["tensor"]] if m["tensor"] else [])
    return Explained(
        "the TensorRT-LLM runtime expects engine inputs/outputs the engine does not have"
        + (f" ({', '.join(names[:4])})" if names else "")
        + ": the engine was built by another TensorRT-LLM release (or its model code) than the runtime loading it",
        "rebuild the engine with the TensorRT-LLM release the runtime (or the Triton backend) comes from, or run the "
        "runtime of the release that built it",
        {"tensors": names[:8] or None},
    )


@_rule(
    "LOG093",
    "triton",
    "backend not installed in this server",
    R.ENVIRONMENT,
    r"unable to find backend library for backend '(?P<backend>[^'\n]+)'"
    r"|unable to find '(?P<pybackend>[\w-]+)/model\.py' for model '(?P<model>[^'\n]+)'",
    also=(R.CONFIG_INVALID,),
)
def _backend_missing(m: re.Match[str]) -> Explained:
    backend = m["backend"] or m["pybackend"]
    if "${" in backend or "{{" in backend:  # a template placeholder nobody filled in (fill_template.py)
        return Explained(
            f"config.pbtxt names the backend {backend!r}: a template placeholder that was never filled in",
            "fill the template's placeholders (e.g. tools/fill_template.py ... triton_backend:tensorrtllm) or write "
            "the backend's name into config.pbtxt",
            {"backend": backend},
            R.CONFIG_INVALID,
        )
    return Explained(
        f"this Triton server has no {backend!r} backend installed (neither its library nor a Python model.py in "
        "the backends directory)",
        f"run a Triton image that ships the {backend} backend (the NGC flavours differ: e.g. the -trtllm-python-py3 "
        "image for TensorRT-LLM), or build/copy the backend into --backend-directory",
        {"backend": backend, "model": m["model"]},
    )


@_rule(
    "LOG094",
    "triton",
    "model not in the repository",
    R.CONFIG_INVALID,
    r"failed to (?:poll|load) model '(?P<model>[^'\n]+)': model not found in any model repository",
)
def _model_not_in_repository(m: re.Match[str]) -> Explained:
    return Explained(
        f"no model repository has a model named {m['model']!r}",
        "check the model name against the repository's directory names (explicit model control loads by directory "
        "name), and the --model-repository paths",
        {"model": m["model"]},
    )


@_rule(
    "LOG095",
    "onnxruntime",
    "input or output name the model does not have",
    R.CONFIG_INVALID,
    r"Invalid (?P<kind>Feed Input|Output) Name:? ?(?P<name>[^\s,]+)"
    r"|Required inputs \((?P<req>\[[^\]\n]*\])\) are missing from input feed \((?P<feed>\[[^\]\n]*\])\)",
)
def _feed_name(m: re.Match[str]) -> Explained:
    if m["req"]:
        return Explained(
            f"the model's inputs {m['req']} are not in the feed {m['feed']}: the caller names the inputs differently "
            "than the model",
            "name the feed entries after session.get_inputs() (or re-export with the input names the caller uses)",
            {"required": m["req"], "fed": m["feed"]},
        )
    kind = "input" if m["kind"].lower().startswith("feed") else "output"
    return Explained(
        f"the model has no {kind} named {m['name']!r}: the caller names it differently than the model",
        f"use the model's {kind} names (session.get_{kind}s()), or re-export with the name the caller uses",
        {kind: m["name"]},
    )
