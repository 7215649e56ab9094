"""Log rules for the setup around a model: the device a checkpoint was saved on, the port, the programs on PATH,
a Triton backend named by a platform name, and a configured value outside the list the program accepts.

Each reads a message that states its cause in its own words, on any engine that prints it (registered before the
cross-engine wording of :mod:`usg.doctor.logs.rules_generic`).
"""

from __future__ import annotations

import difflib
import re

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []


@_rule(
    "LOG096",
    "torch",
    "checkpoint saved on a device this machine does not have",
    R.ENVIRONMENT,
    r"Attempting to deserialize object on (?:a )?(?P<dev>CUDA|MPS|XPU|HPU|cuda|mps|xpu|hpu)? ?device ?(?P<idx>\d+)?"
    r"(?:[^\n]{0,20}?) but (?P<check>torch\.(?:backends\.)?(?P<backend>\w+)\.(?:is_available\(\) is False|"
    r"device_count\(\) is (?P<count>\d+)))",
)
def _deserialize_device(m: re.Match[str]) -> Explained:
    dev = (m["dev"] or m["backend"]).upper()
    if m["count"] is not None:
        where = f"{dev} device {m['idx']}" if m["idx"] else f"a {dev} device"
        return Explained(
            f"the checkpoint's tensors were saved on {where} and this machine has {m['count']} {dev} device(s): "
            "torch.load puts each storage back on the device it was saved from",
            f"load with torch.load(path, map_location='{dev.lower()}:0') (or 'cpu'), then move the model where you "
            "want it",
            {"saved_on": where, "device_count": int(m["count"])},
        )
    return Explained(
        f"the checkpoint's tensors were saved on a {dev} device and this machine has none (or the installed torch "
        f"was built without {dev}): torch.load puts each storage back on the device it was saved from",
        "load with torch.load(path, map_location=torch.device('cpu')); to use the GPU, install a torch build "
        f"with {dev} and check that {m['check'].split(' is ')[0]} is True",
        {"saved_on": dev, "available": False},
    )


# quantization methods vLLM/SGLang releases have added over time: one named in the message but missing from the
# release's list is a method this release predates (vllm#1919: gptq before v0.2.6); other names are typos
_QUANT_METHODS = frozenset(
    [
        "aqlm",
        "awq",
        "awq_marlin",
        "bitblas",
        "bitsandbytes",
        "compressed-tensors",
        "compressed_tensors",
        "deepspeedfp",
        "experts_int8",
        "fbgemm_fp8",
        "fp8",
        "gguf",
        "gptq",
        "gptq_bitblas",
        "gptq_marlin",
        "gptq_marlin_24",
        "hqq",
        "ipex",
        "marlin",
        "modelopt",
        "modelopt_fp4",
        "moe_wna16",
        "mxfp4",
        "neuron_quant",
        "petit_nvfp4",
        "ptpc_fp8",
        "qqq",
        "quark",
        "squeezellm",
        "torchao",
        "tpu_int8",
        "w8a8_int8",
        "w8a8_fp8",
        "exl2",
        "eetq",
    ]
)


def _listed(raw: str) -> list[str]:
    return [v.strip().strip("'\"`") for v in raw.split(",") if v.strip().strip("'\"`")]


def _near_miss(value: str, allowed: list[str]) -> str | None:
    """The listed value ``value`` misspells (case, '-'/'_', a letter or two), if any."""
    norm = {a.lower().replace("-", "_"): a for a in allowed}
    if value.lower().replace("-", "_") in norm:
        return norm[value.lower().replace("-", "_")]
    close = difflib.get_close_matches(value.lower(), [a.lower() for a in allowed], n=1, cutoff=0.8)
    return next((a for a in allowed if a.lower() == close[0]), None) if close else None


@_rule(
    "LOG097",
    "llm server",
    "quantization method this release does not have",
    R.VERSION_COUPLING,
    r"Unknown quantization method:? ['\"`]?(?P<method>[\w.-]+?)['\"`]?\.? (?:Must|Should) be one of "
    r"[\[(](?P<allowed>[^\]\)\n]*)[\])]",
    also=(R.CONFIG_INVALID,),
)
def _quant_method(m: re.Match[str]) -> Explained | None:
    method, allowed = m["method"], _listed(m["allowed"])
    if (typo := _near_miss(method, allowed)) is not None:
        return Explained(
            f"quantization {method!r} is a misspelling of {typo!r}, which this release accepts",
            f"pass --quantization {typo} (or fix quantization_config.quant_method in config.json)",
            {"quantization": method, "allowed": allowed, "meant": typo},
            R.CONFIG_INVALID,
        )
    if method.lower() not in _QUANT_METHODS:  # neither a known method nor a near miss: the message does not say
        return None
    return Explained(
        f"the installed release does not know quantization method {method!r} (it accepts {', '.join(allowed)}): "
        "support for it came in a later release",
        f"upgrade the engine to a release that lists {method!r} (see its supported-quantization table), or serve a "
        f"checkpoint quantized with one of {', '.join(allowed)}",
        {"quantization": method, "allowed": allowed},
    )


# Triton's platform names and the backend that serves each: config.pbtxt takes either platform: "<platform>" or
# backend: "<backend>"; a platform name given as the backend makes the server look for libtriton_<platform>.so
_PLATFORMS = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "pytorch_libtorch": "pytorch",
}


@_rule(
    "LOG098",
    "triton",
    "backend library not found (a platform name given as the backend, or a backend not installed)",
    R.CONFIG_INVALID,
    r"unable to find '(?:[^'\n]*/)?libtriton_\s?(?P<name>[\w-]+)\.so'(?: for model '(?P<model>[^'\n]+)')?",
    also=(R.ENVIRONMENT,),
)
def _backend_library(m: re.Match[str]) -> Explained:
    name, model = m["name"], m["model"]
    if name in _PLATFORMS:
        return Explained(
            "config.pbtxt" + (f" of model {model!r}" if model else "") + f" names {name!r} as the backend: that is "
            f"a platform name, so the server looks for a backend library libtriton_{name}.so that does not exist",
            f'write platform: "{name}" or backend: "{_PLATFORMS[name]}" in config.pbtxt',
            {"backend": name, "platform_backend": _PLATFORMS[name], "model": model},
        )
    return Explained(
        f"this Triton server has no {name!r} backend installed (libtriton_{name}.so is in no backend directory)",
        f"run a Triton image that ships the {name} backend (the NGC flavours differ), or build/copy it into "
        "--backend-directory; check the backend name in config.pbtxt",
        {"backend": name, "model": model},
        R.ENVIRONMENT,
    )


@_rule(
    "LOG099",
    "server",
    "port already in use",
    R.ENVIRONMENT,
    # the line from its start ((?m:^): searched from every position, a lazy [^\n]*? rescans a long line each time)
    r"(?m:^)(?P<line>[^\n]*?(?:\bEADDRINUSE\b|\baddress already in use\b|Only one usage of each socket address)[^\n]*)",
)
def _port_in_use(m: re.Match[str]) -> Explained:
    port = re.search(r"(?:\bport\s*[=:]?\s*|', |:)(\d{4,5})\b", m["line"])
    return Explained(
        "another process (often an earlier instance that did not exit) already listens on the port this server "
        "binds" + (f" ({port[1]})" if port else ""),
        "stop the other process (find it with `ss -ltnp` / `lsof -i :PORT`) or start this server on a free port",
        {"port": int(port[1]) if port else None},
    )


@_rule(
    "LOG100",
    "shell",
    "program not installed or not on PATH",
    R.ENVIRONMENT,
    r"^(?:/usr)?(?:/bin/)?(?:ba|z|da)?sh:(?: \d+:| line \d+:)? (?P<prog>[\w.+-]+): (?:command )?not found\b"
    r"|^(?P<prog2>[\w.+-]+): command not found\b|^(?P<prog3>[a-z][\w.+]*-[\w.+-]+): not found\s*(?:\n|$)",
)
def _command_not_found(m: re.Match[str]) -> Explained:
    prog = m["prog"] or m["prog2"] or m["prog3"]
    return Explained(
        f"the shell cannot find the program {prog!r}: its package is not installed in this environment, or its "
        "directory is not on PATH",
        f"install the package that provides {prog} (in the environment the command runs in; a container needs it "
        "in the image), or call it by its full path",
        {"program": prog},
    )


_VALUE_LIST = re.compile(
    r"(?:invalid|unknown|unsupported|unrecognized|unexpected)\s+(?P<what>[\w -]{1,40}?):?\s+['\"`](?P<value>[^'\"`\n]"
    r"{1,60})['\"`][^\n\[({]{0,60}?(?:must be|should be|expected|expecting|supported (?:values|options) are|valid "
    r"(?:values|options|choices) are|choose from|possible values:?|one of:?)[^\n\[({]{0,20}[\[({](?P<allowed>[^\]\)}\n"
    r"]{1,400})[\])}]",
    re.IGNORECASE,
)


@_rule(
    "LOG101",
    "configuration",
    "value misspelled (a listed value differs by case or a letter)",
    R.CONFIG_INVALID,
    _VALUE_LIST.pattern,
)
def _misspelled_value(m: re.Match[str]) -> Explained | None:
    value, allowed = m["value"], _listed(m["allowed"])
    typo = _near_miss(value, allowed)
    if typo is None or typo == value:  # absent from the list: a newer feature, another engine, or a typo — unknown
        return None
    return Explained(
        f"{m['what'].strip()} {value!r} is not accepted; the accepted values include {typo!r}, which it misspells",
        f"use {typo!r} (accepted: {', '.join(allowed[:12])})",
        {"value": value, "meant": typo, "allowed": allowed[:20]},
    )


@_rule(
    "LOG102",
    "torch",
    "no usable GPU in this process (CPU-only build, no driver, no visible device)",
    R.ENVIRONMENT,
    r"(?P<build>Torch not compiled with CUDA enabled)|(?P<none>No CUDA GPUs are available)"
    r"|(?P<driver>Found no NVIDIA driver on your system)",
)
def _no_gpu(m: re.Match[str]) -> Explained:
    if m["build"]:
        return Explained(
            "the installed torch is a CPU-only build: it has no CUDA support to run on the GPU",
            "install a CUDA build of torch matching the driver (the index URL of pytorch.org's selector, e.g. "
            "cu121), in the environment the program runs in",
            {"reason": "cpu-only torch build"},
        )
    if m["driver"]:
        return Explained(
            "the process finds no NVIDIA driver: no GPU, no driver installed, or a container started without GPU "
            "access",
            "install the NVIDIA driver (nvidia-smi must work), and start containers with GPU access (--gpus all / "
            "the NVIDIA container toolkit)",
            {"reason": "no NVIDIA driver"},
        )
    return Explained(
        "CUDA sees no GPU in this process: CUDA_VISIBLE_DEVICES hides them, the container has no GPU access, or "
        "the driver is not working",
        "check nvidia-smi and CUDA_VISIBLE_DEVICES in the environment the process runs in (a Ray/K8s worker needs "
        "the GPU requested: num_gpus / resources), and start containers with --gpus",
        {"reason": "no visible GPU"},
    )


@_rule(
    "LOG103",
    "operating system",
    "an OS resource refused or exhausted (disk, permissions, open files, shared memory)",
    R.ENVIRONMENT,
    r"\[Errno (?P<errno>28|13|24)\] (?:No space left on device|Permission denied|Too many open files)"
    r"(?::? ?['\"]?(?P<path>[^'\"\n]{1,200})['\"]?)?"
    r"|(?P<shm>insufficient shared memory \(shm\)|out of shared memory\. Please try to raise your shared memory "
    r"limit|No space left on device[^\n]{0,40}/dev/shm)",
)
def _os_resource(m: re.Match[str]) -> Explained:
    if m["shm"]:
        return Explained(
            "the processes ran out of shared memory (/dev/shm): a container's default 64 MB is too small for "
            "DataLoader workers or multi-process inference",
            "start the container with a larger --shm-size (e.g. 8g) or --ipc=host; or use fewer worker processes",
            {"resource": "shared memory"},
        )
    path = m["path"]
    what, fix = {
        "28": ("the disk is full", "free disk space or point the cache/output directory (HF_HOME, TMPDIR) elsewhere"),
        "13": (
            "the process may not read or write a file or directory",
            "fix the owner/permissions of the path, or run with a user that may write it (containers: the mounted "
            "volume's owner)",
        ),
        "24": ("the process hit its limit of open files", "raise the limit (ulimit -n, the container's nofile)"),
    }[m["errno"]]
    return Explained(
        what + (f" ({path})" if path else ""),
        fix,
        {"errno": int(m["errno"]), "path": path},
    )


@_rule(
    "LOG104",
    "native library",
    "shared library not found",
    R.ENVIRONMENT,
    r"(?P<lib>(?:[\w.+-]*/)*lib[\w.+-]*?\.so(?:\.[\w]+)*): cannot open shared object file: (?P<why>No such file or "
    r"directory|Not a directory)",
)
def _shared_library(m: re.Match[str]) -> Explained:
    lib = m["lib"].rsplit("/", 1)[-1]
    if lib.startswith("libcuda.so"):
        return Explained(
            "libcuda.so (the NVIDIA driver's library) is not there: no NVIDIA driver in this machine or container",
            "install the NVIDIA driver, and start containers with GPU access (--gpus all / the NVIDIA container "
            "toolkit), which mounts libcuda into them",
            {"library": lib},
        )
    return Explained(
        f"the dynamic loader cannot find {lib}: the package that provides it is not installed, or its directory is "
        "not on the library path",
        f"install the package that ships {lib} (the version the failing module was built for), or add its "
        "directory to LD_LIBRARY_PATH in the environment the process starts in",
        {"library": lib, "path": m["lib"] if "/" in m["lib"] else None},
    )


@_rule(
    "LOG105",
    "model file",
    "weights or engine file is not what its loader reads (incomplete download, Git LFS pointer, another format)",
    R.CONFIG_INVALID,
    r"SafetensorError: Error while deserializing header: (?P<st>HeaderTooLarge|InvalidHeaderDeserialization|"
    r"MetadataIncompleteBuffer|InvalidHeader\w*)|UnpicklingError: invalid load key, '(?P<key>[^'\n]{1,4})'"
    r"|(?P<trt>magicTagRead == kMAGIC_TAG failed)"
    # torch.load of a truncated file: the storage the header declares is not all there
    r"|storage has wrong size: expected (?P<want>\d+) got (?P<got>\d+)",
)
def _not_a_weights_file(m: re.Match[str]) -> Explained:
    if m["trt"]:
        return Explained(
            "the file given to TensorRT's deserializeCudaEngine is not a TensorRT plan (its magic tag is wrong): an "
            "ONNX file, a plan with a tool's metadata header (e.g. Ultralytics' .engine), or a damaged file",
            "pass the plan file trtexec/the builder wrote (strip a tool's metadata header or load it with that "
            "tool), or rebuild the engine",
            {"file_check": "TensorRT magic tag"},
        )
    if m["st"]:
        what = f"safetensors header ({m['st']})"
    elif m["key"]:
        what = f"pickle load key {m['key']!r}"
    else:
        what = f"a tensor storage of {m['got']} elements where its header declares {m['want']}"
    lfs = " ('v' is the first letter of a Git LFS pointer file: 'version https://git-lfs…')" if m["key"] == "v" else ""
    return Explained(
        f"the weights file is not a complete checkpoint{lfs}: {what} — an interrupted download, a Git LFS pointer "
        "cloned without `git lfs pull`, or another file under the checkpoint's name",
        "download the checkpoint again (huggingface-cli download, or git lfs install && git lfs pull) and compare "
        "the file sizes with the repository's",
        {"file_check": what},
    )


@_rule(
    "LOG106",
    "configuration",
    "two configured limits that contradict each other",
    R.CONFIG_INVALID,
    r"(?<![\w-])(?P<a>(?-i:[a-z][a-z0-9]*(?:_[a-z0-9]+)+))`? \((?P<an>\d+)\) (?:is|must be|should be|cannot be) "
    r"(?P<rel>smaller|larger|greater|less|bigger|higher|lower) than (?:or equal to )?(?:the )?`?"
    r"(?P<b>(?-i:[a-z][a-z0-9]*(?:_[a-z0-9]+)+))`? \((?P<bn>\d+)\)",
)
def _limits_contradict(m: re.Match[str]) -> Explained:
    return Explained(
        f"{m['a']} ({m['an']}) is {m['rel']} than {m['b']} ({m['bn']}): the two settings contradict each other",
        f"set {m['a']} and {m['b']} consistently (raise one or lower the other, as the message asks)",
        {m["a"]: int(m["an"]), m["b"]: int(m["bn"])},
    )
