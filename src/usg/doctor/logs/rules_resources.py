"""Log rules for what a run asks of the machine and of the files it loads: GPUs a cluster's placement group does
not hold, a precision the GPU's hardware lacks, a class a pickled checkpoint names that the loading program does not
define, an optimization profile that ranges over an axis the network fixes, and a file or API version the installed
release says it does not read.

Each reads a message that states its cause in its own words (registered after :mod:`.rules_setup`, before the
cross-engine wording of :mod:`usg.doctor.logs.rules_generic`).
"""

from __future__ import annotations

import re

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []


@_rule(
    "LOG110",
    "ray",
    "more GPUs or bundles asked for than the placement group / cluster holds",
    R.CONFIG_INVALID,
    r"Not enough resources to allocate (?P<want>\d+) placement groups?(?:, only created (?P<got>\d+))?"
    r"|(?P<gpus>number of required GPUs exceeds the total number of available GPUs in the placement group)"
    r"|(?P<driver>Ray does not allocate any GPUs on the driver node)",
)
def _placement_group(m: re.Match[str]) -> Explained:
    if m["driver"]:
        return Explained(
            "the process that starts the engine (Ray's driver) runs on a node whose GPUs are not in the placement "
            "group: the job's GPU layout does not match the cluster's",
            "start the driver on a GPU node of the cluster (ray start --address=<head> on it, then launch there), or "
            "adjust the placement group so it includes the driver node's GPUs",
            {"placement": "driver node without GPUs"},
        )
    if m["gpus"]:
        return Explained(
            "the configured parallelism (tensor x pipeline parallel size) needs more GPUs than the Ray placement "
            "group has",
            "lower tensor_parallel_size/pipeline_parallel_size to the GPUs the cluster has (ray status lists them), "
            "or add GPU nodes before starting",
            {"placement": "GPUs"},
        )
    got = f", only {m['got']} could be created" if m["got"] else ""
    return Explained(
        f"the deployment asks for {m['want']} placement group(s){got}: the cluster's resources cannot hold what "
        "the configuration requests",
        "lower the replicas/GPUs per replica (num_replicas, placement_group_bundles, tensor_parallel_size) to what "
        "`ray status` shows, or add nodes",
        {"placement_groups": int(m["want"]), "created": int(m["got"]) if m["got"] else None},
    )


_PRECISION = r"FP8|FP4|NVFP4|MXFP4|BF16|bfloat16|INT4|INT8|FP16|TF32|FlashAttention\w*|tensor cores?"


@_rule(
    "LOG111",
    "gpu",
    "a precision or feature this GPU's hardware lacks",
    R.ENVIRONMENT,
    rf"require[sd]? (?:a )?(?:hardware|GPUs?|devices?) with (?P<feat2>{_PRECISION}) support"
    rf"|(?P<feat3>{_PRECISION})[^\n]{{0,40}}? (?:is )?not supported (?:on|by) (?:this|the current|your|the) "
    r"(?:GPU|device|hardware)\b"
    rf"|(?:GPU|device|hardware) (?:does not|doesn't|do not|don't) (?:natively )?support (?P<feat4>{_PRECISION})\b",
)
def _hardware_feature(m: re.Match[str]) -> Explained:
    feat = m["feat2"] or m["feat3"] or m["feat4"]
    return Explained(
        f"this GPU has no hardware support for {feat}: the model or engine asks for a precision/feature only newer "
        "GPU architectures have (FP8: Ada/Hopper and later; BF16: Ampere and later)",
        f"build or run without {feat} on this GPU (another quantization/dtype, e.g. fp16 or int8 weight-only), or "
        "use a GPU that supports it",
        {"feature": feat},
    )


@_rule(
    "LOG112",
    "python pickle",
    "a pickled checkpoint names a class the loading program does not have",
    R.ENVIRONMENT,
    r"Can't get attribute '(?P<cls>[\w.]+)' on <module '(?P<mod>[\w.]+)'",
    also=(R.VERSION_COUPLING,),
)
def _pickled_class(m: re.Match[str]) -> Explained:
    cls, mod = m["cls"], m["mod"]
    if mod == "__main__":
        return Explained(
            f"the checkpoint pickles an object of class {cls!r} that the saving script defined at its top level; the "
            "script that loads it does not define (or import) that class",
            f"import or define {cls} in the loading script before torch.load/pickle.load (from <training module> "
            f"import {cls}), or save a state_dict instead of the whole object",
            {"class": cls, "module": mod},
        )
    return Explained(
        f"the pickled file names {mod}.{cls}, which the installed {mod.split('.')[0]} does not have: it was pickled "
        "with another release of that library (the class was moved, renamed or removed)",
        f"install the {mod.split('.')[0]} release the file was saved with (or re-save it with the installed one); "
        "for checkpoints prefer a state_dict/safetensors, which do not pickle classes",
        {"class": cls, "module": mod},
        R.VERSION_COUPLING,
    )


@_rule(
    "LOG113",
    "tensorrt",
    "optimization profile ranges over an axis the network fixes",
    R.DYNAMIC_SHAPE_FIXED,
    r"Dimension mismatch for tensor (?P<tensor>\S+) and profile (?P<profile>\d+)\. At dimension axis (?P<axis>\d+), "
    r"profile has min=(?P<min>-?\d+), opt=(?P<opt>-?\d+), max=(?P<max>-?\d+) but tensor has (?P<has>-?\d+)",
)
def _profile_fixed_axis(m: re.Match[str]) -> Explained:
    return Explained(
        f"the network's input {m['tensor']} has axis {m['axis']} fixed at {m['has']}, while optimization profile "
        f"{m['profile']} asks for {m['min']}..{m['max']} on it: the axis was not exported as dynamic",
        "export the model with that axis dynamic (dynamic_axes / dynamic_shapes), or build the profile with min = opt "
        f"= max = {m['has']} on axis {m['axis']}",
        {
            "tensor": m["tensor"],
            "axis": int(m["axis"]),
            "fixed": int(m["has"]),
            "profile": [int(m["min"]), int(m["opt"]), int(m["max"])],
        },
    )


@_rule(
    "LOG116",
    "tensorrt",
    "network with dynamic inputs built without an optimization profile",
    R.DYNAMIC_SHAPE_FIXED,
    r"Network has dynamic or shape inputs, but no optimization profile has been defined",
)
def _no_profile(m: re.Match[str]) -> Explained:
    return Explained(
        "the network has inputs with dynamic (-1) dimensions, and the builder was given no optimization profile that "
        "says which sizes to build for",
        "add an optimization profile for every dynamic input (trtexec --minShapes/--optShapes/--maxShapes; "
        "builder.create_optimization_profile() + config.add_optimization_profile), or export the model with static "
        "shapes; with ONNX Runtime's TensorRT provider, set trt_profile_min_shapes/_opt_/_max_shapes",
        {"optimization_profile": None},
    )


@_rule(
    "LOG115",
    "runtime release",
    "a file format or API version the installed release does not know (stated by the message)",
    R.VERSION_COUPLING,
    r"(?P<ort>Unknown model file format version)"
    # tokenizers older than the tokenizer.json it reads (a pre-tokenizer/model/normalizer type added later)
    r"|data did not match any variant of untagged enum (?P<enum>Py\w+Wrapper|\w+Wrapper)"
    r"|Since ORT (?P<since>\d+\.\d+), you are required to explicitly set the providers parameter"
    r"|only supports versions (?P<versions>[\d.]+(?:, [\d.]+)*)\. Got version: (?P<given>[^\n]{1,20})"
    r"|(?P<ze>ZE_RESULT_ERROR_UNSUPPORTED_VERSION|MAPPED_INFERENCE_VERSION is NOT compatible)",
)
def _unknown_version(m: re.Match[str]) -> Explained:
    if m["ort"]:
        return Explained(
            "ONNX Runtime does not know the format version of this model file: it was written by a newer exporter "
            "(ONNX IR / ORT format version) than this ONNX Runtime reads",
            "upgrade onnxruntime to a release that supports the model's IR version (onnx.load(path).ir_version), or "
            "re-export / convert the model for the installed release (onnx.version_converter, an older exporter)",
            {"format": "model file format version"},
        )
    if m["enum"]:
        return Explained(
            f"the installed tokenizers library cannot parse this tokenizer.json ({m['enum']}): the file uses a "
            "component type added in a later tokenizers release",
            "upgrade tokenizers (and transformers with it) to the release the tokenizer was saved with",
            {"tokenizers_type": m["enum"]},
        )
    if m["since"]:
        return Explained(
            f"the calling code was written for an ONNX Runtime before {m['since']}, which chose execution providers "
            "by itself; since then InferenceSession needs them named",
            "pass providers=['CUDAExecutionProvider', 'CPUExecutionProvider'] (or the ones this build has) to "
            f"InferenceSession, or pin onnxruntime < {m['since']} for that code",
            {"since": m["since"]},
        )
    if m["versions"]:
        return Explained(
            f"the installed release supports versions {m['versions']} of this model and the model is version "
            f"{m['given'].strip()}: a newer model version than the release knows",
            "upgrade to a release that lists this model version (its release notes), or use a model version it lists",
            {"supported_versions": m["versions"], "version": m["given"].strip()},
        )
    return Explained(
        "the NPU driver and the compiler/OpenVINO release do not match (the driver reports an unsupported version of "
        "the compiled graph)",
        "install the NPU driver release that matches the OpenVINO release (its release notes list the pair)",
        {"npu_version_check": m["ze"]},
    )


@_rule(
    "LOG117",
    "torchscript",
    "a TorchScript file names a type or op the loading libtorch does not know",
    R.VERSION_COUPLING,
    # TorchScript's capitalised wording (a C compiler's "error: unknown type name 'size_t'" is left alone)
    r"(?-i:Unknown (?:type name|builtin op:?)) '?(?P<name>[\w.:]*\w)'?",
    also=(R.ENVIRONMENT,),
)
def _torchscript_unknown(m: re.Match[str]) -> Explained:
    name = m["name"]
    custom = "torch.classes" in name or ("::" in name and name.split("::", 1)[0] not in ("aten", "prim", "quantized"))
    if custom:  # a custom op/class: the library that registers it is not loaded in the loading process
        return Explained(
            f"the TorchScript file uses {name!r}, a custom op or class the loading process has not registered: the "
            "library that defines it is not loaded",
            "load the extension before torch.jit.load (torch.ops.load_library('libcustom_ops.so') / import the "
            "package; Triton: LD_PRELOAD or the model's library path)",
            {"name": name},
            R.ENVIRONMENT,
        )
    return Explained(
        f"the TorchScript file uses {name!r}, which the loading libtorch does not know: the file was scripted/traced "
        "by a newer PyTorch than the runtime loading it (Triton's libtorch backend, a C++ app, an older torch)",
        "script/trace the model with the PyTorch release of the runtime (the Triton release notes list its libtorch), "
        "or upgrade the runtime",
        {"name": name},
    )
