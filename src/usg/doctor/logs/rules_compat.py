"""Log rules for artifacts, builds and GPUs that do not fit together: a TensorRT engine plan built by
another TensorRT or on another GPU, kernels the GPU (or the install) lacks, an exporter that cannot
write the opset asked for.

Each message states both sides (the version or compute capability expected and the one found), so
the rule reports them as evidence and says which side to change.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (before the drift rule).
"""

from __future__ import annotations

import re

from usg.doctor.findings import Severity
from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []


@_rule(
    "LOG038",
    "tensorrt",
    "engine plan from another TensorRT or GPU",
    R.VERSION_COUPLING,
    r"engine plan file is (?:not compatible with this version of TensorRT, expecting library version "
    r"(?P<runtime>[\d.]+) got (?P<plan>[\d.]+)|generated on an incompatible device, expecting compute "
    r"(?P<gpu>[\d.]+) got compute (?P<built>[\d.]+))"
    r"|Version tag does not match\. Note: Current Version: (?P<cur>\d+), Serialized Engine Version: (?P<ser>\d+)"
    # TensorRT 5-7 said it without the versions: "Serialization Error in verifyHeader: 0 (Version tag does not match)"
    r"|(?P<tag>Serialization Error in verifyHeader: \d+ \(Version tag does not match\))",
    also=(R.ENVIRONMENT,),
)
def _trt_plan(m: re.Match[str]) -> Explained:
    if m["cur"]:
        return Explained(
            f"the engine was serialized by another TensorRT (serialization version {m['ser']}) than the one loading "
            f"it ({m['cur']}): a plan only loads in the TensorRT version that built it",
            "rebuild the engine with the TensorRT (or TensorRT-LLM) release of the serving image, and check that only "
            "one TensorRT is installed (LD_LIBRARY_PATH and the Python package can point at different ones)",
            {"runtime_serialization_version": int(m["cur"]), "engine_serialization_version": int(m["ser"])},
        )
    if m["tag"]:
        return Explained(
            "the engine was serialized by another TensorRT than the one loading it (its version tag differs): a plan "
            "only loads in the TensorRT version that built it",
            "rebuild the engine with the TensorRT of the machine/image that runs it (build it there), and check that "
            "only one TensorRT is installed",
            {"serialization_version_tag": "differs"},
        )
    if m["runtime"]:
        return Explained(
            f"the engine was built with TensorRT {m['plan']} but is loaded by TensorRT {m['runtime']}: a plan "
            "only loads in the TensorRT version that built it",
            f"rebuild the engine with TensorRT {m['runtime']} (build inside the serving container/image), or serve "
            f"it with TensorRT {m['plan']}; do not pip-install another TensorRT into a serving image",
            {"runtime_tensorrt": m["runtime"], "engine_tensorrt": m["plan"]},
        )
    return Explained(
        f"the engine was built on a GPU of compute capability {m['built']} and is loaded on one of {m['gpu']}: a "
        "plan only runs on the GPU model it was built for",
        f"rebuild the engine on the serving GPU (compute {m['gpu']}), one engine per GPU type",
        {"runtime_compute_capability": m["gpu"], "engine_compute_capability": m["built"]},
        R.ENVIRONMENT,
    )


@_rule(
    "LOG039",
    "cuda",
    "kernels not available for this GPU or install",
    R.ENVIRONMENT,
    r"(?P<ampere>FlashAttention only supports Ampere GPUs or newer)"
    r"|(?P<model>\w[\w ()./-]{0,100}?) requires Flash Attention enabled models"
    r"|(?P<image>no kernel image is available for execution on the device)",
)
def _gpu_kernels(m: re.Match[str]) -> Explained:
    if m["ampere"]:
        why = "the FlashAttention kernels need an Ampere (compute capability 8.0) or newer GPU"
        fix = "serve on an Ampere+ GPU, or turn flash attention off (TGI: USE_FLASH_ATTENTION=False; eager attention)"
    elif m["model"]:
        why = f"{m['model'].strip()} needs the flash-attention kernels, which this install or GPU does not provide"
        fix = (
            "use the official image on a GPU it supports (Ampere+ for flash attention v2), or install the kernels "
            "(TGI: make install-flash-attention); without them serve unsharded"
        )
    else:
        why = "the CUDA kernels of this build were not compiled for this GPU's architecture (compute capability)"
        fix = (
            "install a wheel/image built for your GPU's compute capability (or build from source with it in "
            "TORCH_CUDA_ARCH_LIST / CUDA_ARCHS), or disable the kernel library that lacks it"
        )
    return Explained(why, fix, {"gpu_requirement": m.group(0)[:200]})


@_rule(
    "LOG041",
    "tgi",
    "flash-attention kernels not importable",
    R.ENVIRONMENT,
    r"Could not import Flash Attention enabled models: (?P<why>[^\n]*)",
    Severity.WARNING,  # printed at every start of an install without them: the root only if nothing fails
)
def _no_flash(m: re.Match[str]) -> Explained:
    return Explained(
        f"the flash-attention kernels are not importable in this install ({m['why'].strip()[:120]}): models that "
        "need them (sharded Llama and others) will not start",
        "use the official Docker image, or build the kernels into this environment (TGI: make install-flash-attention)",
        {"reason": m["why"].strip()[:200]},
    )


@_rule(
    "LOG040",
    "torch.onnx",
    "exporter cannot write this opset",
    R.VERSION_COUPLING,
    r"Unsupported ONNX opset version:? (?P<opset>\d+)",
    Severity.ERROR,
)
def _opset(m: re.Match[str]) -> Explained:
    return Explained(
        f"the installed exporter (torch.onnx) cannot write opset {m['opset']}: the export script asks for a newer "
        "opset than this torch release knows",
        f"upgrade torch to a release that exports opset {m['opset']}, or export with an older opset_version",
        {"opset": int(m["opset"])},
    )


# architectures vLLM and SGLang have served since their first releases: reported "not supported", the model
# module failed to import (a broken install), the architecture is not missing
_BASIC_ARCHS = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "GPT2LMHeadModel",
        "GPTNeoXForCausalLM",
        "GPTBigCodeForCausalLM",
        "GPTJForCausalLM",
        "OPTForCausalLM",
        "BloomForCausalLM",
        "FalconForCausalLM",
    }
)


@_rule(
    "LOG042",
    "vllm/sglang",
    "known architecture reported unsupported",
    R.ENVIRONMENT,
    r"Model architectures? \[(?P<archs>[^\]\n]*)\] (?:are|is) not supported(?: for now)?\.?"
    r"(?:\s*Supported architectures: (?P<supported>[^\n]*))?",
)
def _arch_import(m: re.Match[str]) -> Explained | None:
    archs = re.findall(r"[\w.]+", m["archs"])
    listed = [a for a in archs if m["supported"] and re.search(rf"['\"]{re.escape(a)}['\"]", m["supported"])]
    basic = [a for a in archs if a in _BASIC_ARCHS]
    if not (listed or basic):
        return None  # not implemented, or only in a newer release: known cases decide
    arch = (listed or basic)[0]
    why = "it is in the engine's own list of supported architectures" if listed else "every release supports it"
    return Explained(
        f"{arch} is reported unsupported although {why}: its model module failed to import in this install",
        "look above for the import error of the model module (a missing/mismatched dependency such as "
        "transformers, flash-attn or triton, or a failing registry subprocess) and fix that install",
        {"architecture": arch, "listed_as_supported": bool(listed)},
    )


_LIBRARIES = frozenset(
    {
        "transformers",
        "torch",
        "vllm",
        "sglang",
        "onnxruntime",
        "onnx",
        "tensorrt",
        "tensorrt_llm",
        "optimum",
        "flashinfer",
        "flash_attn",
        "ray",
        "openvino",
        "triton",
        "xformers",
        "sgl_kernel",
        "accelerate",
        "peft",
    }
)


@_rule(
    "LOG043",
    "python",
    "module or name not importable",
    R.ENVIRONMENT,
    r"(?:ModuleNotFoundError: )?No module named (?:'(?P<mod>[\w.]+)'?|(?P<bare>[A-Za-z_][\w.]*))"  # the closing quote
    # may be cut off; Python 2 and some wrappers print the name without quotes
    r"|(?:ImportError: )?cannot import name '(?P<name>\w+)' from (?P<partial>partially initiali[sz]ed module )?"
    r"'(?P<src>[\w.]+)'",
    also=(R.VERSION_COUPLING,),
)
def _import(m: re.Match[str]) -> Explained:
    if m["name"] and (m["partial"] or re.search(r"circular import", m.string[m.end() : m.end() + 200])):
        return Explained(  # a file or directory of the user's named like the package is imported instead of it
            f"{m['src']} is imported while it is still initialising (a circular import): a local file or directory "
            f"named like {m['src'].split('.')[0]!r} shadows the installed package",
            f"rename the local {m['src'].split('.')[0]}.py / {m['src'].split('.')[0]}/ (and delete its __pycache__) or "
            "run from another directory",
            {"name": m["name"], "module": m["src"]},
        )
    if m["name"]:  # the package is there but lacks the name: another release than the importer expects
        top = m["src"].split(".")[0]
        return Explained(
            f"the installed {top} has no {m['name']} (in {m['src']}): it is another release than the code importing "
            "it was written for",
            f"install the {top} version the importing package pins (pip install '<importer>[...]' / its "
            "requirements), or upgrade/downgrade both together",
            {"name": m["name"], "module": m["src"]},
            R.VERSION_COUPLING,
        )
    mod = m["mod"] or m["bare"]
    top = mod.split(".")[0]
    if hint := re.search(r"pip install\s+(?:\"[^\"\n]+\"|'[^'\n]+'|[^\s`'\"]+)", m.string[m.end() : m.end() + 200]):
        install = hint.group(0)  # the message names what to install: an extra or package left out of this install
        return Explained(
            f"{mod} is not installed; the message itself says how to install it: {install}",
            f"run `{install}` in the environment that runs the process (container image, venv, Ray runtime_env)",
            {"module": mod, "install": install},
        )
    if "." in mod and mod.rsplit(".", 1)[1].startswith("_"):  # vllm._C, torch._C: a compiled extension
        return Explained(
            f"the compiled extension {mod} is missing: {top} is a source checkout that was not built, or a wheel "
            "built for another Python/platform",
            f"install a {top} wheel for this Python and CUDA (or build the checkout: pip install -e . with its "
            "build requirements); do not run from the source tree of an installed package",
            {"module": mod, "package": top},
        )
    if "." in mod and top in _LIBRARIES:  # the library is installed, this submodule is not in its release
        return Explained(
            f"the installed {top} has no module {mod}: that release predates (or dropped) it",
            f"upgrade {top} to a release that has {mod} (or install the version the caller pins)",
            {"module": mod, "package": top},
            R.VERSION_COUPLING,
        )
    return Explained(
        f"Python module {mod!r} is not installed where this process runs",
        f"install {top} in that environment (the container image, the Ray runtime_env / worker image, the venv), "
        "or fix the import path of your own package",
        {"module": mod},
    )


@_rule(
    "LOG046",
    "onnxruntime",
    "execution provider not available",
    R.ENVIRONMENT,
    r"Failed to load library (?P<lib>libonnxruntime_providers_\w+\.(?:so|dll)) with error: (?P<err>[^\n]+)"
    r"|Failed to create (?P<ep>\w+ExecutionProvider)"
    r"|Specified provider '(?P<asked>\w+)' is not in available provider names\.? ?Available providers: "
    r"'?(?P<avail>[^'\n]*)"
    r"|Asked to use (?P<asked2>\w+) as an ONNX Runtime execution provider, but the available execution providers "
    r"are (?P<avail2>\[[^\]]*\])"
    r"|`onnxruntime-gpu` is installed, but GPU dependencies are not loaded",
    also=(R.VERSION_COUPLING,),
)
def _ort_provider(m: re.Match[str]) -> Explained:
    ev = {
        "provider": m["ep"] or m["asked"] or m["asked2"],
        "available": m["avail"] or m["avail2"],
        "library": m["lib"],
        "load_error": m["err"].strip()[:200] if m["err"] else None,
    }
    if ev["available"]:  # the installed package has no such provider at all
        return Explained(
            f"ONNX Runtime was asked for {ev['provider']} but this package only has {ev['available']}: the CPU build "
            "(onnxruntime) is installed, or both onnxruntime and onnxruntime-gpu are and the CPU one wins",
            "install only the GPU package (pip uninstall onnxruntime onnxruntime-gpu; pip install onnxruntime-gpu) "
            "matching your CUDA version",
            ev,
        )
    if ev["load_error"] and "undefined symbol" in ev["load_error"]:
        # the provider library and the libraries it links against were found and loaded: one of them lacks a symbol
        # the other was built with, i.e. they come from different releases (not a missing library); "undefined
        # symbol" is a release mismatch in 11 of the 12 corpus entries that state it
        return Explained(
            f"ONNX Runtime's provider library {ev['library']} loads, but a library it links against lacks a symbol it "
            f"was built with ({ev['load_error']}): that library (TensorRT, CUDA or cuDNN) is another release than "
            "the one this onnxruntime-gpu build was made for",
            "install the TensorRT/CUDA/cuDNN versions this onnxruntime-gpu release was built for (its requirements "
            "table) and make them the ones found first (LD_LIBRARY_PATH), or pick the onnxruntime-gpu build for the "
            "installed ones",
            ev,
            R.VERSION_COUPLING,
        )
    return Explained(
        f"ONNX Runtime could not create the {ev['provider'] or 'GPU'} execution provider"
        + (f": {ev['load_error']}" if ev["load_error"] else "")
        + " — the CUDA/cuDNN (or TensorRT) libraries it links against are missing or of another version, and the "
        "session falls back to CPU",
        "install the CUDA and cuDNN versions this onnxruntime-gpu release was built for (its requirements table) "
        "and make them visible (LD_LIBRARY_PATH / the pip nvidia-* wheels), or pick the onnxruntime-gpu build for "
        "your CUDA",
        ev,
    )


# the library a C++ symbol belongs to, from the first name of its Itanium mangling (_ZN3c10..., _ZNK12tensorrt_llm...)
_SYMBOL_OWNERS = {
    "c10": "PyTorch",
    "at": "PyTorch",
    "torch": "PyTorch",
    "tensorrt_llm": "TensorRT-LLM",
    "nvinfer1": "TensorRT",
}


@_rule(
    "LOG076",
    "native library",
    "compiled extension built against another release (undefined symbol)",
    R.VERSION_COUPLING,
    r"(?:(?P<lib>[\w.+-]+\.so(?:\.[\w.]+)?)[^\n]{0,12}?)?undefined symbol: (?P<sym>_Z\w+)",
)
def _undefined_symbol(m: re.Match[str]) -> Explained | None:
    mangled = re.match(r"_ZN?K?(\d+)", m["sym"])
    owner = _SYMBOL_OWNERS.get(m["sym"][mangled.end() : mangled.end() + int(mangled[1])]) if mangled else None
    if owner is None:  # a symbol of the user's own or an unknown library: the message does not say whose release
        return None
    lib = m["lib"] or "a compiled extension"
    return Explained(
        f"{lib} was compiled against another {owner} release than the installed one: the {owner} symbol it needs "
        f"({m['sym'][:80]}) is not there",
        f"install the build of {lib.split('/')[-1]} made for the installed {owner} (or the {owner} version it was "
        f"built for); rebuild it from source against this {owner} if no such build exists",
        {"library": m["lib"], "symbol": m["sym"][:200], "built_against": owner},
    )


@_rule(
    "LOG047",
    "vllm",
    "quantization kernels need a newer GPU",
    R.ENVIRONMENT,
    r"(?:quantization method (?P<method>[\w-]+) is not supported for the current GPU|Quantization scheme is not "
    r"supported for '?,? ?'?the current GPU)\.? ?'?,? ?'?Min(?:imum)? capability: (?P<min>\d+)\.? ?'?,? ?'?Current "
    r"capability: (?P<cur>\d+)",
)
def _quant_capability(m: re.Match[str]) -> Explained:
    need, have = int(m["min"]), int(m["cur"])
    what = f"quantization method {m['method']}" if m["method"] else "the checkpoint's quantization scheme"
    return Explained(
        f"{what} needs GPU compute capability {need / 10:.1f} or newer; this GPU is {have / 10:.1f}",
        "serve the unquantized (bf16/fp16) checkpoint or one quantized for this GPU (e.g. GPTQ/AWQ where fp8 needs "
        f"Hopper/Ada), or use a GPU of compute capability >= {need / 10:.1f}",
        {"quantization": m["method"], "min_compute_capability": need, "compute_capability": have},
    )


@_rule(
    "LOG048",
    "triton",
    "backend built for another Triton",
    R.VERSION_COUPLING,
    r"Triton backend API version does not support this backend"
    r"|Triton TRITONBACKEND API version: (?P<server>[\d.]+) does not support '(?P<backend>[\w-]+)' TRITONBACKEND API "
    r"version: (?P<api>[\d.]+)",
)
def _backend_api(m: re.Match[str]) -> Explained:
    if m["backend"]:
        return Explained(
            f"the {m['backend']} backend was built for Triton backend API {m['api']}, and this server implements "
            f"{m['server']}: backend and server come from different Triton releases",
            f"use the {m['backend']} backend of the server's release (the same NGC image / the backend's release "
            "branch matching the server), or a server of the backend's release",
            {"backend": m["backend"], "server_api": m["server"], "backend_api": m["api"]},
        )
    return Explained(
        "the backend library was built against another Triton backend API than this server's: backends only load "
        "in the Triton release they were built for",
        "use the backend from the same Triton release/container as the server (e.g. the python backend of "
        "r<version>), or rebuild it against this server's TRITON_BACKEND_API",
        {"message": m.group(0)},
    )


@_rule(
    "LOG072",
    "transformers",
    "model type newer than the installed transformers",
    R.VERSION_COUPLING,
    r"CONFIG_MAPPING\[config_dict\[.model_type.\]\].{0,400}?KeyError: '(?P<ctx>[\w.-]+)'"
    r"|^\W*KeyError: '(?P<mt>(?-i:[a-z][a-z0-9_]*\d[a-z0-9_]*))'"
    # transformers' own wording since 4.3x (7 of the corpus's 8 such entries are version_coupling; the eighth is a
    # remote-code model, which the fix names)
    r"|has model type [`'\"]?(?P<said>[\w.-]+)[`'\"]? but\s+Transformers does not recognize this architecture",
)
def _unknown_model_type(m: re.Match[str]) -> Explained:
    model_type = m["ctx"] or m["mt"] or m["said"]
    return Explained(
        f"the checkpoint's config.json names model_type {model_type!r}, which the installed transformers does not "
        "know (its CONFIG_MAPPING has no such key): the model is newer than that transformers release",
        f"upgrade transformers to a release that has {model_type!r} (see the model card's required version; "
        "engines such as vLLM/SGLang pin their own transformers), or load it with trust_remote_code if the model "
        "ships its own code",
        {"model_type": model_type},
    )


@_rule(
    "LOG073",
    "triton",
    "platform unknown to this Triton release",
    R.VERSION_COUPLING,
    r"unexpected platform type '?(?P<platform>[\w.-]+)'? for '?(?P<model>[\w.-]+)",
)
def _unknown_platform(m: re.Match[str]) -> Explained:
    return Explained(
        f"this Triton server does not know platform {m['platform']!r} (model {m['model']!r}): most often the "
        "platform came after this release (or this release mishandles it); a server built without that backend "
        "says the same",
        f"run a Triton release that supports {m['platform']!r}, built with its backend (the NGC image has them all; "
        "a source build needs --backend for it), or give config.pbtxt the backend field this release documents",
        {"platform": m["platform"], "model": m["model"]},
    )
