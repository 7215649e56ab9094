"""Features of an error message shared by the nearest-case index (:mod:`.similar`) and the linear
layer (:mod:`.model`): the message as the vectorisers see it, and its error-vocabulary groups."""

from __future__ import annotations

import re

__all__ = ["ENGINE_RE", "features_text", "vocab_vector"]

_ENGINES: dict[str, str] = {
    "triton": r"tritonserver|model_repository_manager|model_lifecycle|backend_model|config\.pbtxt|"
    r"InferenceServerException|\btriton|max_batch_size|stub process",
    "onnxruntime": r"onnxruntime|ONNXRuntimeError|\bORT\b|InferenceSession|ExecutionProvider",
    "tensorrt": r"\[TRT\]|TensorRT|ModelImporter|trtexec|nvinfer|onnx2trt|optimization profile|tactic",
    "trtllm": r"TensorRT-LLM|tensorrt_llm|trtllm|TRT-LLM",
    "vllm": r"vllm|VllmWorker|llm_engine|gpu_memory_utilization|max_model_len",
    "sglang": r"sglang|mem-fraction-static|mem_fraction_static|cuda graph",
    "tgi": r"text_generation|shard-manager|ShardCannotStart|max-batch-prefill|max_new_tokens",
    "transformers": r"transformers|from_pretrained|tokenizer|image tokens|model type",
    "torch_onnx": r"torch\.onnx|TracerWarning|opset|symbolic|dynamo|GuardOnDataDependent|aten::",
    "ray": r"\bray\b|ray\.|raylet|ServeController|replica|RayActorError|Deployment",
    "openvino": r"openvino|InferenceEngine|ov::|Model Optimizer|CompiledModel|read_model|compile_model|"
    r"Check '[^'\n]*' failed at|Exception from src|intel_[cg]pu|While validating node|NETWORK_NOT_READ|ngraph|"
    r"IECore|load_network|\bmo(?:_tf)?\.py|\.xml\b",
    "cuda": r"CUDA out of memory|cuda|cudnn|GPU",
}
ENGINE_RE = {name: re.compile(pat, re.IGNORECASE) for name, pat in _ENGINES.items()}
# error vocabulary shared across engines: each group adds one feature word when the message uses it
_VOCAB: dict[str, str] = {
    "memory": r"out of memory|\bOOM\b|OutOfMemory|allocat|insufficient memory|not enough memory|memory pressure|"
    r"kv cache|mem[-_]fraction|workspace|exceed(?:s|ed)? allowed memory|free memory|gpu_memory_utilization",
    "dtype": r"data ?type|\bdtype|tensor\((?:float|double|int\d*|bool|float16)\)|\bTYPE_[A-Z0-9]+|PrimitiveDataType|"
    r"\bHalf\b|float16|\bint64\b|\bint32\b|tensor\(bool\)|Type Error|precision",
    "shape": r"\bshape|dimension|\bdims?\b|\brank\b|index: \d+ Got|size mismatch|broadcast|sequence length|"
    r"image tokens|image size|\bGot: \d+",
    "unsupported": r"not supported|unsupported|No importer|not implemented|NOT_IMPLEMENTED|"
    r"could not find an implementation|Exporting the operator|architectures? .*not supported|custom or unsupported",
    "version": r"\bversion|opset|undefined symbol|newer|older|upgrade|built against|out of date|does not recognize|"
    r"Assertion failed: tensors\.count|checkpoint",
    "environment": r"LoadLibrary|No module named|ModuleNotFoundError|cannot open shared|shared library|"
    r"compute capability|\bdriver\b|signal \d|Stub process|runtime environment|libcudart|ImportError|unable to find",
    "config": r"\bconfig|configuration|pbtxt|model_type|no such file|does not exist|doesn't exist|must be <=|"
    r"\$\{|allowed inputs|not a (?:input|output)|resources required|failed to start",
    "dynamic": r"TracerWarning|treated as a constant|registered as constants|\bdynamic|optimization profile|"
    r"data-dependent|guard|\btrace\b|engine supports|satisfy any optimization profile|between \d+ and \d+",
    "batch": r"\bbatch|max_batch_size|batch-size",
    # the calling code and the library it calls come from different releases, whatever versions the message states
    # (or not): a keyword, attribute, name, member or argument count one side has and the other lacks
    "api": r"unexpected keyword argument|module '[\w.]+' has no attribute|cannot import name|"
    r"missing \d+ required (?:positional|keyword)|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but|"
    r"expected at most \d+ argument|has no member named|no matching function for call|undefined symbol|"
    r"symbol lookup error|not defined in file",
}
_VOCAB_RE = {name: re.compile(pat, re.IGNORECASE) for name, pat in _VOCAB.items()}
_HEX = re.compile(r"0x[0-9a-f]+", re.IGNORECASE)
_NUM = re.compile(r"\b\d+(?:\.\d+)?\b")
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/](?:[\w.\-]+[\\/])+([\w.\-]+)")
_SHAPE = re.compile(r"[\[({]\s*-?\d+(?:\s*[,x.]\s*-?\d+)+\s*,?\s*[\])}]")
_DTYPE = re.compile(
    r"\btensor\((?:\w+)\)|\bTYPE_[A-Z0-9]+\b|\b(?:float|int|uint|bfloat)(?:8|16|32|64)\b|\bfp(?:8|16|32|64)\b|"
    r"\b[fiu](?:8|16|32|64)\b|\bbf16\b|PrimitiveDataType<?\w*>?",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"""(?<![\w])['"`]([^'"`\n]{1,80})['"`]""")


# Triton names the model version in every load message ("failed to load 'm' version 1", "unable to autofill for 'm'
# due to no version directories"): the number of a model in a repository, not a software version
_MODEL_VERSION = re.compile(r"(?<=['\"]) version \d+\b", re.IGNORECASE)
_NO_VERSION_DIR = re.compile(r"\bno version director(?:y|ies)\b", re.IGNORECASE)


def _neutral(text: str) -> str:
    return _NO_VERSION_DIR.sub("no modeldir", _MODEL_VERSION.sub(" modelver", text))


def features_text(text: str) -> str:
    """The message as the vectorisers see it, with the values that differ from engine to engine made
    alike: paths reduced to file names; shapes, dtype names and quoted names (tensors, ops, models,
    files) to placeholder words; numbers and addresses too (their presence matters, their value
    rarely); plus one token per engine named."""
    text = _neutral(text)
    out = _PATH.sub(lambda m: " " + m.group(1) + " ", text)
    out = _HEX.sub(" hexaddr ", out)
    out = _SHAPE.sub(" shapeval ", out)
    out = _DTYPE.sub(" dtypeval ", out)
    out = _QUOTED.sub(" qname ", out)
    out = _NUM.sub(" num ", out)
    engines = [f"engine{name}" for name, rx in ENGINE_RE.items() if rx.search(text)]
    return out + " " + " ".join(engines)


def vocab_vector(text: str) -> list[float]:
    """One 0/1 feature per error-vocabulary group (memory, dtype, shape, ...), unit-normalised."""
    text = _neutral(text)
    v = [1.0 if rx.search(text) else 0.0 for rx in _VOCAB_RE.values()]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v] if norm else v
