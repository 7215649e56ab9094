"""Log rules keyed on causal vocabulary that several engines share, not on one engine's sentence.

Each rule states a cause in words any runtime may use: memory that is "not enough"/"insufficient", a
symbolic shape the exporter cannot decide ("data-dependent"), a model file that cannot be opened or
is not a model at all, a GPU architecture a kernel does not support, a TensorFlow graph naming an
attribute its reader's op does not have. They sit after the engine-specific rules (a message an
engine rule knows keeps that rule's reading) and before the drift rule.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (before the drift rule).
"""

from __future__ import annotations

import re
from typing import Any

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []

_QTY = re.compile(r"\b\d+(?:\.\d+)?\s*(?:[a-z]+\s+)?(?:[KMGT]i?B|bytes|tokens)\b", re.IGNORECASE)
_FLAG = re.compile(r"(?:--|`)([a-z][\w-]*[a-z])`?")
_CONDITIONAL = re.compile(r"\b(?:if|in case|to avoid|to prevent)\b[^.;:\n]*$", re.IGNORECASE)


@_rule(
    "LOG059",
    "memory",
    "not enough memory (stated in words)",
    R.MEMORY,
    r"\b(?:not enough|insufficient) (?:GPU |device |host |CPU |system )?memory\b|\bno memory is available\b|"
    r"\bcannot allocate memory\b|"
    # "out of memory" in any engine's words (CUDA runtime/driver codes, TensorRT's "Error Code 2: OutOfMemory",
    # torch's OutOfMemoryError without "Tried to allocate", XLA's RESOURCE_EXHAUSTED, TensorFlow's OOM): all 31
    # corpus excerpts with these words are memory
    r"\bout of (?:GPU |device |host |CUDA |CPU )?memory\b|OutOfMemory|\bOOM when allocating\b|"
    r"cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|\bwould exceed (?:the )?allowed memory\b",
)
def _not_enough_memory(m: re.Match[str]) -> Explained | None:
    line = m.string[m.string.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0]
    if _CONDITIONAL.search(m.string[max(0, m.start() - 40) : m.start()]):
        return None  # advice printed at start-up ("If you are running out of memory, consider ..."), not an error
    ev: dict[str, Any] = {"quantities": _QTY.findall(line)[:4] or None}
    flags = [f for f in _FLAG.findall(line) if "-" in f or "_" in f]
    if flags:
        ev["settings_named"] = list(dict.fromkeys(flags))[:4]
    named = f" (the message names {', '.join(ev['settings_named'])})" if flags else ""
    return Explained(
        f"the engine reports it has not enough memory for what it was asked to reserve{named}",
        "lower what is reserved up front (max batch/prefill tokens, max length, KV-cache fraction, workspace) or "
        "raise the memory fraction the engine may use; free the device from other processes",
        ev,
    )


_EXPR = re.compile(r"Could not guard on data-dependent expression (?P<expr>[^\n]{1,160}?)(?: \(unhinted|\.\s|$)")


@_rule(
    "LOG060",
    "torch.export",
    "shape decided by data (data-dependent guard)",
    R.DYNAMIC_SHAPE_FIXED,
    r"Could not guard on data-dependent expression|GuardOnDataDependentSymNode",
)
def _data_dependent(m: re.Match[str]) -> Explained:
    found = _EXPR.search(m.string, m.start())
    expr = found["expr"].strip() if found else None
    return Explained(
        "the exporter meets a branch or size that depends on tensor values (a data-dependent symbol"
        + (f": {expr}" if expr else "")
        + "); it cannot keep the shape symbolic",
        "make the shape explicit for export: torch._check()/torch._check_is_size() on the value, mark the "
        "dimension dynamic with its range, or rewrite the branch with torch.where/torch.cond",
        {"expression": expr},
    )


_LIB = re.compile(r"\.so\b|\.dll\b|shared object|shared librar", re.IGNORECASE)


@_rule(
    "LOG061",
    "model file",
    "model file missing or not a model",
    R.CONFIG_INVALID,
    r"NO_SUCHFILE|(?:Could not|Cannot|Can't|Unable to|Failed to) open (?:the )?(?:model |weights? |engine |onnx )?"
    r"file:? ?(?P<path>\S+)?|(?P<text>Error parsing text-format (?P<proto>[\w.]*ModelProto))",
)
def _model_file(m: re.Match[str]) -> Explained | None:
    line = m.string[m.string.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0]
    if _LIB.search(line):  # a shared library that does not load: an install problem, not the model's path
        return None
    if m["text"]:
        return Explained(
            f"the parser read the model file as text ({m['proto']}): the file given is not a binary model (a wrong "
            "path, a text or HTML file, an incomplete download)",
            "pass the path of the .onnx model itself; check its size and that it loads with onnx.load()",
            {"proto": m["proto"]},
        )
    path = (m["path"] or "").strip("'\"`").rstrip(",.") or None
    return Explained(
        "the model file named cannot be opened" + (f": {path}" if path else ""),
        "fix the path in the command or configuration (relative paths resolve from the working directory); "
        "check that the export/download wrote the file",
        {"path": path},
    )


@_rule(
    "LOG062",
    "cuda kernels",
    "GPU architecture not supported by a kernel",
    R.ENVIRONMENT,
    r"(?<!custom or )\bUnsupported (?:GPU |SM |CUDA )?architecture\b(?![s:])",
)
def _gpu_arch(m: re.Match[str]) -> Explained:
    line = m.string[m.string.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0]
    where = re.search(r"\w+\.(?:cuh|cu|cpp|h)\b", line) or re.search(r"\w+Runner\b", line)
    return Explained(
        "a GPU kernel does not support this GPU's architecture"
        + (f" ({where.group(0)})" if where else "")
        + ": the build has no code for its compute capability",
        "run on a GPU generation the kernel supports, disable that kernel (another attention backend / plugin), "
        "or install a build compiled for this compute capability",
        {"kernel": where.group(0) if where else None},
    )


@_rule(
    "LOG063",
    "tensorflow",
    "graph attribute unknown to the reader's op",
    R.VERSION_COUPLING,
    r"NodeDef mentions attr '(?P<attr>[^']+)' not in Op<name=(?P<op>\w+)",
)
def _nodedef_attr(m: re.Match[str]) -> Explained:
    return Explained(
        f"the graph's {m['op']} node carries attribute {m['attr']!r}, which the reading TensorFlow's {m['op']} "
        "does not have: the graph was written by a newer TensorFlow than the one converting or running it",
        "convert/run with the TensorFlow version that saved the graph (or newer), or re-save the model with the "
        "older TensorFlow",
        {"attribute": m["attr"], "op": m["op"]},
    )


_BUILTIN_TYPES = r"NoneType|str|int|float|list|dict|tuple|bool|bytes|set|function|method"


@_rule(
    "LOG066",
    "python/c++ api",
    "code and library from different releases (API mismatch)",
    R.VERSION_COUPLING,
    r"AttributeError: module '(?P<mod>[\w.]+)' has no attribute '(?P<attr>\w+)'"
    r"|(?P<func>[\w.]+)\(\) got an unexpected keyword argument '(?P<kw>\w+)'"
    r"|(?P<func2>[\w.]+)\(\) missing (?P<miss>\d+) required (?:positional|keyword-only) arguments?: "
    r"(?P<args>[^\n]{1,120})"
    # a positional/keyword layout one release has and the other lacks
    r"|(?P<func3>[\w.]+)\(\) (?:got multiple values for (?:keyword )?argument '(?P<dup>\w+)'|takes (?:from )?"
    r"(?P<takes>\d+(?: to \d+)?) positional arguments? but (?P<given>\d+) (?:were|was) given)"
    r"|(?P<op>[\w.:]+)\(\) expected at most (?P<most>\d+) argument\(s\) but received (?P<got>\d+)"
    r"|has no member named ['‘\"](?P<member>\w+)['’\"]"
    # an object of a library class without the attribute its caller uses (21 of the corpus's 25 such
    # messages are a version mismatch); NoneType is a value that is missing, not an API, and is left alone
    r"|(?:type object ['‘](?P<tcls>[\w.]+)['’]|['‘]?(?P<cls>[\w.]+)['’](?: ['‘][\w.]+['’])? object) has no "
    r"attribute ['‘](?P<oattr>\w+)['’]?"
    r"|AttributeError: (?P<bcls>[A-Z]\w+) has no attribute (?P<battr>\w+)",
)
def _api_mismatch(m: re.Match[str]) -> Explained | None:
    if cls := m["cls"] or m["tcls"] or m["bcls"]:
        if cls == "NoneType":
            return None
        attr = m["oattr"] or m["battr"]
        what = f"{cls} objects of the installed release have no attribute {attr!r}, which the calling code uses"
        ev: dict[str, Any] = {"object": cls, "name": attr}
    elif m["mod"]:
        top = m["mod"].split(".")[0]
        if top in ("__main__", "builtins"):  # the user's own script: no library release involved
            return None
        what = f"the installed {m['mod']} has no {m['attr']!r}"
        ev = {"module": m["mod"], "name": m["attr"]}
    elif m["func"] or m["func2"] or m["func3"]:
        func = m["func"] or m["func2"] or m["func3"]
        if re.fullmatch(rf"(?:{_BUILTIN_TYPES})\.\w+", func):
            return None
        if m["kw"]:
            what = f"{func}() does not take the keyword {m['kw']!r} its caller passes"
            ev = {"function": func, "keyword": m["kw"]}
        elif m["dup"]:
            what = f"{func}() receives {m['dup']!r} both by position and by keyword: its parameter order differs"
            ev = {"function": func, "argument": m["dup"]}
        elif m["takes"]:
            what = f"{func}() takes {m['takes']} positional argument(s) and its caller passes {m['given']}"
            ev = {"function": func, "takes": m["takes"], "given": int(m["given"])}
        else:
            what = f"{func}() is called without {m['miss']} argument(s) its signature requires ({m['args'].strip()})"
            ev = {"function": func, "missing": m["args"].strip()}
    elif m["op"]:
        what = f"{m['op']}() takes at most {m['most']} arguments but its caller passes {m['got']}"
        ev = {"operator": m["op"], "declared": int(m["most"]), "passed": int(m["got"])}
    else:
        what = f"the headers the code compiles against have no member {m['member']!r}"
        ev = {"member": m["member"]}
    return Explained(
        what + ": the calling code and the library (or compiled extension) it calls come from different releases",
        "install the library version the calling package was written for (its requirements pin it), or upgrade the "
        "caller and the library together; for compiled extensions rebuild them against the installed release",
        ev,
    )


@_rule(
    "LOG071",
    "cpu",
    "illegal instruction (SIGILL)",
    R.ENVIRONMENT,
    r"signal(?:ed to shutdown with signal)? 4\b|\bIllegal instruction\b|\bSIGILL\b",
)
def _illegal_instruction(m: re.Match[str]) -> Explained:
    return Explained(
        "the process died of an illegal instruction (signal 4, SIGILL): the binary uses CPU instructions "
        "(AVX/AVX2/AVX-512, ...) this host's CPU or virtual CPU does not offer",
        "run on a CPU with the instruction set the build assumes (expose the host CPU flags to the VM/container), or "
        "use a build for this CPU (a generic/no-AVX wheel or image, or build from source on it)",
        {"signal": 4},
    )


@_rule(
    "LOG074",
    "config",
    "argument, model id or file the program cannot parse",
    R.CONFIG_INVALID,
    r"(?P<repo>HFValidationError: Repo id must[^\n]*)"
    r"|error: invalid value '(?P<value>[^'\n]*)' for '(?P<flag>--?[\w-]+)(?: <[\w-]+>)?'"
    r"|(?P<zip>PytorchStreamReader failed reading zip archive: failed finding central directory)"
    r"|(?P<json>\[json\.exception\.parse_error\.\d+\] parse error at line \d+, column \d+)",
)
def _unparsable_input(m: re.Match[str]) -> Explained:
    if m["flag"]:
        return Explained(
            f"the command line gives {m['flag']} the value {m['value']!r}, which the program does not accept",
            f"pass {m['flag']} one of the values its --help lists (flags are case-sensitive: 'true', not 'True')",
            {"flag": m["flag"], "value": m["value"]},
        )
    if m["zip"]:
        return Explained(
            "the checkpoint file is not a complete PyTorch archive (a truncated or failed download, a git-lfs "
            "pointer file, or another format saved under a .pt/.bin name)",
            "download the checkpoint again (git lfs pull) and check its size, or point the config at the real file",
            {},
        )
    if m["json"]:
        return Explained(
            "a JSON configuration file is empty or malformed (" + m["json"] + ")",
            "check the JSON file the backend reads (e.g. the engine's config.json): that it exists where the config "
            "points, is not empty, and parses (python -m json.tool)",
            {},
        )
    named = re.search(r":\s*'(?P<id>[^'\n]+)'\.?\s*$", m["repo"])
    repo = named["id"] if named else None
    return Explained(
        "the model path is neither an existing local directory nor a valid Hugging Face repo id"
        + (f": {repo!r}" if repo else ""),
        "pass an existing local directory (absolute path) or an 'org/name' repo id; a suffix such as ':branch' "
        "or a typo in the path makes it neither",
        {"model_id": repo},
    )


@_rule(
    "LOG075",
    "llm server",
    "tensor-parallel size does not divide the model or the GPUs",
    R.CONFIG_INVALID,
    r"(?P<what>[\w ]{3,60}?) \((?P<size>\d+)\) must be divisible by (?:the )?tensor[ _-]?parallel(?: size)? "
    r"\((?P<tp>\d+)\)"
    r"|(?P<what2>number of [\w ]{3,40}?) is not divisible by the number of tensor parallelism"
    r"|choo?sen size (?P<size3>\d+) is not compatible with sharding on (?P<tp3>\d+) shards",
)
def _tp_split(m: re.Match[str]) -> Explained:
    """vLLM's "Total number of attention heads (12) must be divisible by tensor parallel size (8)", "The number of GPUs
    per node is not divisible by the number of tensor parallelism"; TGI's "The choosen size 65027 is not compatible
    with sharding on 4 shards": the model (or the node) is split into a number of shards its sizes cannot be cut into.
    """
    if m["size3"]:
        ev: dict[str, Any] = {"size": int(m["size3"]), "shards": int(m["tp3"])}
        what = f"a weight dimension of {m['size3']} cannot be split evenly over {m['tp3']} shards"
    elif m["size"]:
        ev = {"of": m["what"].strip(), "size": int(m["size"]), "tensor_parallel_size": int(m["tp"])}
        what = f"{m['what'].strip()} ({m['size']}) cannot be split evenly over tensor parallel size {m['tp']}"
    else:
        ev = {"of": m["what2"].strip()}
        what = f"the {m['what2'].strip()} is not a multiple of the tensor-parallel size"
    return Explained(
        what + ": the tensor-parallel (shard) count is configured for another model or node",
        "set the tensor-parallel size / number of shards to a divisor of the model's attention heads and vocabulary "
        "and of the GPUs per node (e.g. restrict CUDA_VISIBLE_DEVICES), or use pipeline parallelism for the rest",
        ev,
    )


@_rule(
    "LOG081",
    "pytorch",
    "checkpoint written for torch.load's old default (weights_only)",
    R.VERSION_COUPLING,
    r"Weights only load failed\b(?P<rest>[^\n]*\n?[^\n]*\n?[^\n]*\n?[^\n]*)",
)
def _weights_only(m: re.Match[str]) -> Explained | None:
    """PyTorch 2.6 made ``torch.load(weights_only=True)`` the default; its message says so. Without that sentence
    (an older PyTorch, the caller asked for weights_only) the message names no release change."""
    change = re.search(r"In PyTorch (?P<ver>\d+\.\d+), we changed the default value of the .?weights_only", m["rest"])
    if change is None:
        return None
    glob = re.search(r"Unsupported global: GLOBAL (?P<g>[\w.]+)", m.string[m.start() : m.start() + 2000])
    return Explained(
        f"the checkpoint (or the code loading it) was written for torch.load's default before PyTorch "
        f"{change['ver']}: the installed release loads weights only, and the file holds other objects"
        + (f" ({glob['g']})" if glob else ""),
        "if the file is trusted, load it with torch.load(..., weights_only=False) or allow its globals with "
        "torch.serialization.add_safe_globals; or install the calling package's release made for this PyTorch "
        f"(or PyTorch < {change['ver']})",
        {"changed_in": change["ver"], "global": glob["g"] if glob else None},
    )


@_rule(
    "LOG082",
    "packages",
    "installed package older than the minimum its caller needs",
    R.VERSION_COUPLING,
    r"(?P<pkg>[\w.-]+) with minimum required version (?P<min>\d+(?:\.\d+)+\w*) is not installed"
    r"|(?P<pkg2>[\w.-]+) ?(?:>=|version >=?|version) ?(?P<min2>\d+(?:\.\d+)+\w*) is required(?:[^\n]{0,60}?"
    r"(?:but|found|got|installed)[^\n]{0,20}?(?P<have2>\d+(?:\.\d+)+\w*))?"
    # the same statement in other words: a range ("tokenizers>=0.19,<0.20 is required ... but found
    # tokenizers==0.20.3"), "<caller> requires <pkg> >= A, but <pkg> B was found", "<pkg> version B is not supported,
    # please install <pkg>>=A"
    r"|(?P<pkg3>[\w.-]+)(?P<spec3>(?:>=|==|~=)\d+(?:\.\d+)*\w*,\s?(?:<|<=|!=)\d+(?:\.\d+)*\w*) is required[^\n]{0,60}?"
    r"but found (?:[\w.-]+==)?(?P<have3>\d+(?:\.\d+)+\w*)"
    r"|requires (?P<pkg4>[\w.-]+) ?>= ?(?P<min4>\d+(?:\.\d+)*\w*),? but (?:found )?(?:[\w.-]+ )?"
    r"(?:version )?(?P<have4>\d+(?:\.\d+)+\w*)"
    r"|(?P<pkg5>[\w.-]+) version (?P<have5>\d+(?:\.\d+)+\w*) is not supported,? please (?:install|upgrade to|use) "
    r"[\w.-]+ ?>= ?(?P<min5>\d+(?:\.\d+)*\w*)"
    # "<pkg> is installed with version B, which is less than the minimum required version A"
    r"|(?P<pkg6>[\w.-]+) is installed with version (?P<have6>\d+(?:\.\d+)+\w*),? which is (?:less|lower|older) than "
    r"the minimum required version (?P<min6>\d+(?:\.\d+)*\w*)",
)
def _minimum_version(m: re.Match[str]) -> Explained | None:
    pkg = m["pkg"] or m["pkg2"] or m["pkg3"] or m["pkg4"] or m["pkg5"] or m["pkg6"]
    low = m["min"] or m["min2"] or m["spec3"] or m["min4"] or m["min5"] or m["min6"]
    have = m["have2"] or m["have3"] or m["have4"] or m["have5"] or m["have6"]
    # the machine, not a package ("flashinfer_python" is a package; "Python" alone the interpreter)
    if re.search(r"driver|cuda|nvidia|gpu|capability|sm_?\d", pkg, re.IGNORECASE) or re.fullmatch(
        r"python\d*(?:\.\d+)?", pkg, re.IGNORECASE
    ):
        return None
    spec = low if low[0] in "<>=~!" else f">={low}"
    return Explained(
        f"{pkg}{spec} is required" + (f", {have} is installed" if have else " and is not installed"),
        f"install '{pkg}{spec}' (the release the caller was written for)",
        {"package": pkg, "minimum": low, "installed": have},
    )


@_rule(
    "LOG085",
    "native library",
    "system C/C++ runtime older than the binary needs",
    R.ENVIRONMENT,
    r"version [`'‘]?(?P<sym>(?:GLIBC|GLIBCXX|CXXABI)_[\d.]+)['’]? not found(?: \(required by (?P<by>[^)\n]+)\))?",
)
def _old_system_runtime(m: re.Match[str]) -> Explained:
    lib = "glibc" if m["sym"].startswith("GLIBC_") else "libstdc++"
    return Explained(
        f"the system's {lib} is older than the one {m['by'] or 'the binary'} was built against (it needs {m['sym']})",
        f"run on a distribution (or container image) whose {lib} provides {m['sym']}, put a newer {lib} first on "
        "LD_LIBRARY_PATH (e.g. conda's libstdcxx-ng), or install a build made for this system",
        {"symbol_version": m["sym"], "required_by": m["by"]},
    )


@_rule(
    "LOG086",
    "native library",
    "Windows DLL not found",
    R.ENVIRONMENT,
    r"(?:DLL load failed(?: while importing (?P<mod>[\w.]+))?|Unable to load DLL '(?P<dll>[^'\n]+)'):?\s*"
    r"(?P<why>The specified (?:module|procedure) could not be found|[^\n'\"]{0,80})",
)
def _dll_load(m: re.Match[str]) -> Explained | None:
    m_mod = m["dll"] or m["mod"]  # .NET names the DLL, Python the module importing it
    if "procedure" in m["why"].lower():  # the DLL is there but lacks an entry point: another build, not a missing one
        return None
    what = f" ({m_mod})" if m_mod else ""
    return Explained(
        f"Windows could not load a DLL the native module needs{what}: a runtime it depends on (the Visual C++ "
        "redistributable, CUDA/cuDNN, the engine's own libraries) is not installed or not on PATH",
        "install the Visual C++ redistributable and the CUDA/cuDNN (or engine) runtime the package was built for, and "
        "add their bin directories to PATH (Python 3.8+: os.add_dll_directory)",
        {"module": m_mod},
    )


@_rule(
    "LOG087",
    "transformers",
    "package registers a name the installed transformers already has",
    R.VERSION_COUPLING,
    r"['‘](?:<class ['‘])?(?P<name>[\w.]+)(?:['’]>)?['’] is already used by a Transformers (?P<kind>model|config)",
)
def _registered_twice(m: re.Match[str]) -> Explained:
    name = m["name"].rsplit(".", 1)[-1]
    return Explained(
        f"a package registers {name} with transformers' Auto classes, and the installed transformers already has a "
        f"{m['kind']} under that name: transformers is newer than the release the package was written for",
        "install the transformers version the package pins (or a release of the package made for this transformers)",
        {"name": name, "registered": m["kind"]},
    )


@_rule(
    "LOG088",
    "torch.export",
    "construct or op the exporter cannot trace",
    R.UNSUPPORTED_OP,
    r"torch\._dynamo\.exc\.Unsupported: (?P<what>[^\n]{1,200})|Unsupported FX nodes: (?P<fx>\{[^\n]{1,300})",
)
def _dynamo_unsupported(m: re.Match[str]) -> Explained:
    what = (m["what"] or m["fx"]).strip()
    ops = re.findall(r"aten[._]\w+(?:\.\w+)?", what)
    return Explained(
        f"the exporter (TorchDynamo / torch.export) does not support what the model does: {what[:160]}",
        "rewrite that part of the model with supported ops, register a custom op / decomposition (or an ONNX "
        "translation) for it, or export with the TorchScript exporter (dynamo=False) where it supports the op",
        {"unsupported": what[:200], "ops": ops[:6] or None},
    )


@_rule(
    "LOG089",
    "transformers",
    "model class without the requested attention implementation",
    R.UNSUPPORTED_OP,
    r"(?P<model>\w+) does not support (?P<impl>Flash Attention 2(?:\.0)?|an attention implementation through "
    r"torch\.nn\.functional\.scaled_dot_product_attention|SDPA|Flex Attention) yet",
)
def _attention_impl(m: re.Match[str]) -> Explained:
    return Explained(
        f"{m['model']} has no {m['impl']} implementation",
        'load it with attn_implementation="eager" (or another implementation it supports)',
        {"model": m["model"], "attention": m["impl"]},
    )


@_rule(
    "LOG090",
    "cuda",
    "CUDA cannot count the GPUs (driver or GPU setup)",
    R.ENVIRONMENT,
    r"Unexpected error from cudaGetDeviceCount\(\)(?:[^\n]{0,200}?Error (?P<code>\d+): (?P<why>[^\n.]+))?",
)
def _device_count(m: re.Match[str]) -> Explained:
    why = f" (error {m['code']}: {m['why'].strip()})" if m["code"] else ""
    return Explained(
        f"the CUDA runtime cannot query the GPUs{why}: the driver, the GPU (fabric manager on NVSwitch systems) or "
        "the container's GPU access is not set up for this CUDA",
        "check nvidia-smi in the same environment; start nvidia-fabricmanager on NVSwitch machines (error 802), "
        "install a driver matching the CUDA build (error 803/804), pass the GPUs to the container",
        {"cuda_error": int(m["code"]) if m["code"] else None, "reason": m["why"].strip() if m["why"] else None},
    )


@_rule(
    "LOG091",
    "transformers",
    "model repository config without a model type",
    R.CONFIG_INVALID,
    r"Unrecognized model in (?P<repo>\S+?)\. Should have a `?model_type`? key in its config\.json",
)
def _no_model_type(m: re.Match[str]) -> Explained:
    return Explained(
        f"{m['repo']}'s config.json names no model_type (and the name says none): it is not a transformers model "
        "repository, or its config is incomplete",
        "point at a transformers model repository (check the path / repo id), or add model_type to its config.json; "
        "models of other libraries load with their own loaders",
        {"repository": m["repo"]},
    )


@_rule(
    "LOG092",
    "transformers",
    "remote model code needs packages that are not installed",
    R.ENVIRONMENT,
    r"This modeling file requires the following packages that were not found in your environment: "
    r"(?P<pkgs>[\w-]+(?:, ?[\w-]+)*)",
)
def _remote_code_packages(m: re.Match[str]) -> Explained:
    pkgs = [p.strip() for p in m["pkgs"].split(",") if p.strip()]
    return Explained(
        f"the model's own code imports {', '.join(pkgs)}, which is not installed",
        f"pip install {' '.join(pkgs)} (or, for optional kernels like flash_attn, load the model with an attention "
        "implementation that does not need them)",
        {"packages": pkgs},
    )


@_rule(
    "LOG107",
    "torch",
    "input features do not fit a linear layer",
    R.SHAPE_OR_RANK,
    r"mat1 and mat2 shapes cannot be multiplied \((?P<a>\d+)x(?P<k>\d+) and (?P<k2>\d+)x(?P<n>\d+)\)",
)
def _matmul_shapes(m: re.Match[str]) -> Explained:
    return Explained(
        f"the input to a linear layer has {m['k']} features per row and the layer expects {m['k2']} (matrices "
        f"{m['a']}x{m['k']} and {m['k2']}x{m['n']})",
        f"give the layer inputs of {m['k2']} features: check the input size/resolution and the flatten before the "
        "layer, or build the layer for the size the model now produces",
        {"input_features": int(m["k"]), "expected_features": int(m["k2"])},
    )


@_rule(
    "LOG108",
    "torch",
    "kernel without the tensor's dtype on this device",
    R.DTYPE_OR_RANGE,
    r"\"(?P<kernel>\w+)\" not implemented for '(?P<dtype>Half|BFloat16|Float|Double|Long|Int|Bool|Byte|Char|Short|"
    r"ComplexFloat|Float8_\w+)'",
)
def _kernel_dtype(m: re.Match[str]) -> Explained:
    cpu = "cpu" in m["kernel"].lower() or m["dtype"] in ("Half", "BFloat16")
    hint = " (half precision on the CPU: most CPU kernels take float32 only)" if cpu else ""
    return Explained(
        f"the {m['kernel']} kernel has no implementation for {m['dtype']} tensors on this device{hint}",
        "cast the tensors (or load the model with torch_dtype) to a dtype the kernel takes — float32 on the CPU — "
        "or run on the device the half-precision model was meant for (the GPU)",
        {"kernel": m["kernel"], "dtype": m["dtype"]},
    )
