"""Recognise unseen phrasings: nearest labelled cases by TF-IDF similarity (scikit-learn).

The signature rules know messages as the engines print them; users paste them wrapped, prefixed,
translated by a launcher, or from engines no rule covers. :class:`CaseIndex` turns a message into
features — its error vocabulary (word uni/bigrams), its spelling (character 3-5-grams, robust to
prefixes and wrapped lines), the engine it names and the shape of its numbers — and finds the
most similar cases of the labelled corpus (:mod:`.corpus`). The class is the similarity-weighted
vote of the nearest cases; the confidence is that vote's share, damped when even the nearest case
is far. Below :data:`MIN_SIMILARITY` the message stays unclassified: no forced guesses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from usg.doctor.findings import RootCause
from usg.doctor.logs.corpus import LabelledCase, load_corpus
from usg.errors import MissingDependency

__all__ = ["MIN_CONFIDENCE", "MIN_SIMILARITY", "CaseIndex", "Neighbour", "Prediction", "causal_line", "features_text"]

MIN_SIMILARITY = 0.15  # nearest case less similar than this: unclassified
MIN_CONFIDENCE = 0.35  # vote share (damped) below this: unclassified
K = 9
# weights of the three similarities: word vocabulary, spelling (character n-grams), error-vocabulary groups
WEIGHTS = (0.3, 0.3, 0.4)

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
    "openvino": r"openvino|InferenceEngine|ov::|Model Optimizer|CompiledModel|read_model",
    "cuda": r"CUDA out of memory|cuda|cudnn|GPU",
}
_ENGINE_RE = {name: re.compile(pat, re.IGNORECASE) for name, pat in _ENGINES.items()}
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
}
_VOCAB_RE = {name: re.compile(pat, re.IGNORECASE) for name, pat in _VOCAB.items()}
_HEX = re.compile(r"0x[0-9a-f]+", re.IGNORECASE)
_NUM = re.compile(r"\b\d+(?:\.\d+)?\b")
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/](?:[\w.\-]+[\\/])+([\w.\-]+)")
_ERRORISH = re.compile(
    r"(error|exception|failed|failure|invalid|not supported|unsupported|out of memory|mismatch|cannot|"
    r"unable|could not|not found|expected|unexpected|incompatible|exceeds?|larger than)",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"""['"`]([^'"`\n]{1,80})['"`]""")
_SHAPE = re.compile(r"[\[(]\s*-?\d+(?:\s*[,x.]\s*-?\d+)+\s*[\])]")
_DTYPE = re.compile(r"\btensor\((\w+)\)|\bTYPE_\w+|\b(?:float|int|uint|bfloat)\d+\b|\bfp(?:16|32|8)\b", re.IGNORECASE)
_QTY = re.compile(r"\b\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes|tokens|MiB|GiB)\b", re.IGNORECASE)


def features_text(text: str) -> str:
    """The message as the vectorisers see it: paths reduced to file names, numbers and addresses to
    placeholder words (their presence matters, their value rarely), plus one token per engine named."""
    out = _PATH.sub(lambda m: " " + m.group(1) + " ", text)
    out = _HEX.sub(" hexaddr ", out)
    out = _NUM.sub(" num ", out)
    engines = [f"engine{name}" for name, rx in _ENGINE_RE.items() if rx.search(text)]
    return out + " " + " ".join(engines)


def vocab_vector(text: str) -> list[float]:
    """One 0/1 feature per error-vocabulary group (memory, dtype, shape, ...), unit-normalised."""
    v = [1.0 if rx.search(text) else 0.0 for rx in _VOCAB_RE.values()]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v] if norm else v


def causal_line(text: str) -> str:
    """The line that states the error: the first one with error vocabulary, else the first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if _ERRORISH.search(ln) and not ln.startswith(("File ", "at ", "^")):
            return ln[:400]
    return lines[0][:400] if lines else ""


def message_evidence(line: str) -> dict[str, Any]:
    """Numbers, names, shapes and dtypes the causal line states."""
    ev: dict[str, Any] = {"causal_line": line}
    if names := _QUOTED.findall(line):
        ev["names"] = list(dict.fromkeys(names))[:6]
    if shapes := _SHAPE.findall(line):
        ev["shapes"] = shapes[:4]
    if dtypes := [m.group(0) for m in _DTYPE.finditer(line)]:
        ev["dtypes"] = list(dict.fromkeys(dtypes))[:4]
    if qty := _QTY.findall(line):
        ev["quantities"] = qty[:6]
    nums = [n for n in _NUM.findall(line)]
    if nums:
        ev["numbers"] = nums[:8]
    return ev


@dataclass(frozen=True)
class Neighbour:
    case: LabelledCase
    similarity: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.case.url,
            "root_cause": self.case.root_cause.value,
            "similarity": round(self.similarity, 3),
            "resolution": self.case.resolution,
        }


@dataclass(frozen=True)
class Prediction:
    root_cause: RootCause | None  # None: not similar enough to any known case
    confidence: float
    neighbours: list[Neighbour] = field(default_factory=list)


def _sklearn() -> Any:
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependency("scikit-learn", "doctor", "matching log messages against known cases") from exc
    return TfidfVectorizer


class CaseIndex:
    """Index over labelled cases: TF-IDF word 1-2-grams, TF-IDF character 3-5-grams and the
    error-vocabulary groups, each compared by cosine and combined with :data:`WEIGHTS`."""

    def __init__(self, cases: Sequence[LabelledCase]) -> None:
        if not cases:
            raise ValueError("a case index needs at least one labelled case")
        tfidf = _sklearn()
        self.cases = list(cases)
        docs = [features_text(c.excerpt) for c in self.cases]
        self._word = tfidf(
            lowercase=True, token_pattern=r"(?u)\b[a-z_][a-z0-9_]+\b", ngram_range=(1, 2), sublinear_tf=True
        )
        self._char = tfidf(
            lowercase=True, analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, max_features=60000
        )
        self._wm = self._word.fit_transform(docs)
        self._cm = self._char.fit_transform(docs)
        import numpy as np

        self._np = np
        self._vm = np.array([vocab_vector(c.excerpt) for c in self.cases])

    @classmethod
    def default(cls, exclude_projects: Sequence[str] = ()) -> CaseIndex:
        return cls(load_corpus(exclude_projects))

    def nearest(self, text: str, k: int = K) -> list[Neighbour]:
        doc = [features_text(text)]
        ww, wc, wv = WEIGHTS
        sims = (self._wm @ self._word.transform(doc).T).toarray().ravel() * ww
        sims += (self._cm @ self._char.transform(doc).T).toarray().ravel() * wc
        sims += (self._vm @ self._np.array(vocab_vector(text))) * wv
        order = sims.argsort()[::-1][:k]
        return [Neighbour(self.cases[i], float(sims[i])) for i in order if sims[i] > 0]

    def predict(self, text: str) -> Prediction:
        near = self.nearest(text)
        if not near or near[0].similarity < MIN_SIMILARITY:
            return Prediction(None, 0.0, near[:3])
        votes: dict[RootCause, float] = {}
        for n in near:
            votes[n.case.root_cause] = votes.get(n.case.root_cause, 0.0) + n.similarity**2
        best = max(votes, key=lambda c: votes[c])
        share = votes[best] / sum(votes.values())
        confidence = share * min(1.0, near[0].similarity / 0.5)
        if confidence < MIN_CONFIDENCE:
            return Prediction(None, round(confidence, 3), near[:3])
        return Prediction(best, round(confidence, 3), [n for n in near if n.case.root_cause is best][:3])
