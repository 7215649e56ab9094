"""Log rule for numerical drift between frameworks: "the output differs from PyTorch", allclose failures.

Users report a converted model whose results differ from the original's in prose more often than
in an engine's error line ("the ONNX output is different from PyTorch", "max abs diff 0.03",
"accuracy dropped from 76% to 12% after converting to TensorRT"). No error marker flags such a
sentence, so this rule reads it: the numbers stated (max absolute / relative difference, the
tolerance, mismatched elements, accuracy before and after) and the frameworks named become the
evidence. Registered last (after :mod:`usg.doctor.logs.rules_engines`): a message another rule
knows (a shape or dtype mismatch) is classified by that rule first.
"""

from __future__ import annotations

import re
from typing import Any

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__ = ["drift_evidence"]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
_OUT = r"(?:outputs?|results?|predictions?|logits|values|embeddings|inference results?|accuracy|scores?)"
_DIFF = (
    r"(?:differ(?:s|ent|ence)?|mismatch(?:es|ed)?|inconsistent|deviat(?:es?|ions?)|not (?:the )?same"
    r"|(?:do|does|did)(?: not|n't) match|wrong|incorrect)"
)
_ADV = (
    r"(?:(?:that|which)\s+)?(?:(?:is|are|was|were|seems?|looks?|became|becomes|get|gets|got)\s+)?"
    r"(?:(?:quite|slightly|very|completely|totally|significantly|much|so|a bit|a little|always|still|sometimes)\s+)*"
)
# a "mismatch" of the shape, type, count or names of outputs belongs to the shape/dtype/config rules
_NOT_OF = (
    r"(?<!shape of )(?<!shapes of )(?<!shape of the )(?<!shapes of the )(?<!number of )(?<!type of )(?<!names of )"
)
_NOT_WHAT = r"(?!\s+(?:shapes?|dims?|dimensions?|ranks?|d?types?|sizes?|lengths?|names?|counts?|versions?)\b)"
# a hypothetical ("might silently give incorrect results", a TracerWarning's caveat) is not a report of drift
_HYPOTHETICAL = r"(?![^\n]*\b(?:might|may|could|can)\s+(?:\w+\s+){0,6}(?:incorrect|wrong|different|inconsistent)\b)"
# the whole match lies on the error line itself (the first line of the window)
_PATTERN = (
    rf"\A{_HYPOTHETICAL}[^\n]*?(?:"
    rf"{_NOT_OF}\b{_OUT}\s+(?:of [\w .'-]{{1,60}}?\s+)?{_ADV}{_DIFF}\b{_NOT_WHAT}"  # "the output is quite different"
    rf"|\b{_DIFF}\s+{_OUT}\s+(?:from|than|between|compared|with|to|on|in)\b"  # "different results from PyTorch"
    rf"|\bmax(?:imum)?[ _.-]*abs(?:olute)?[ _.-]*(?:diff|difference|error|err)\b[^\n]{{0,80}}?{_NUM}"
    r"|\b(?:wrong|incorrect) (?:results?|outputs?|predictions?)\b"
    r"|\bnot within (?:the )?(?:set |given )?tolerance"
    rf"|\bvalues not close enough, max diff:?\s*{_NUM}"  # optimum / transformers.onnx export validation
    r"|\bNot equal to tolerance\b"
    r"|\bTensor-likes are not (?:close|equal)"
    r"|\bMismatched elements: \d+ / \d+"
    r"|\ballclose\b[^\n]{0,40}?(?:fail|false|returns? false|is false)"
    r"|\baccuracy\s+(?:\w+\s+){0,2}(?:drop(?:s|ped)?|degrad\w*|decreas\w*|loss|lower)\b"
    r"|\b(?:drop|decrease|degradation|loss)\s+(?:in|of)\s+accuracy\b"
    r")"
)
_FRAMEWORKS = {
    "PyTorch": r"pytorch|\btorch\b|eager",
    "ONNX Runtime": r"onnx ?runtime|\bort\b",
    "ONNX": r"\bonnx\b(?! ?runtime)",
    "TensorRT": r"tensor ?rt|\btrt\b",
    "OpenVINO": r"openvino",
    "TensorFlow": r"tensorflow|\btf\b|keras",
    "CoreML": r"core ?ml",
    "TFLite": r"tflite|tf lite",
    "vLLM": r"vllm",
    "transformers": r"transformers|hugging ?face",
}
_FW = {name: re.compile(p, re.IGNORECASE) for name, p in _FRAMEWORKS.items()}
_MAX_ABS = re.compile(
    rf"max(?:imum)?[ _.-]*(?:abs(?:olute)?[ _.-]*)?(?:diff|difference|error|err)\w*[^\d\n]{{0,60}}?({_NUM})", re.I
)
_MAX_REL = re.compile(
    rf"max(?:imum)?[ _.-]*rel(?:ative)?[ _.-]*(?:diff|difference|error|err)\w*[^\d\n]{{0,60}}?({_NUM})", re.I
)
_TOL = re.compile(rf"\b(?:a?tol(?:erance)?|rtol)\b[^\d\n]{{0,20}}?({_NUM})", re.I)
_MISMATCH = re.compile(r"Mismatched elements: (\d+) / (\d+)", re.I)
_ACC = re.compile(rf"accuracy[^\n]{{0,60}}?from\s+({_NUM})\s*%?\s*to\s+({_NUM})\s*%?", re.I)
_PRECISION = re.compile(r"\b(fp16|fp8|bf16|bfloat16|float16|half precision|int8|int4|quanti[sz]\w*)\b", re.I)


def drift_evidence(text: str) -> dict[str, Any]:
    """The numbers and frameworks a drift report states (absent values are left out)."""
    ev: dict[str, Any] = {}
    fws = [name for name, rx in _FW.items() if rx.search(text)]
    if "ONNX Runtime" in fws and "ONNX" in fws:
        fws.remove("ONNX")  # named as the runtime already
    if fws:
        ev["frameworks"] = fws
    for key, rx in (("max_abs_diff", _MAX_ABS), ("max_rel_diff", _MAX_REL), ("tolerance", _TOL)):
        m = rx.search(text)
        if m:
            ev[key] = float(m[1])
    m = _MISMATCH.search(text)
    if m:
        ev["mismatched_elements"], ev["total_elements"] = int(m[1]), int(m[2])
    m = _ACC.search(text)
    if m:
        ev["accuracy_before"], ev["accuracy_after"] = float(m[1]), float(m[2])
    m = _PRECISION.search(text)
    if m:
        ev["precision"] = m[1].lower()
    return ev


@_rule("LOG034", "numerics", "outputs differ between frameworks", R.OP_SEMANTIC_DRIFT, _PATTERN)
def _drift(m: re.Match[str]) -> Explained:
    text = m.string
    ev = drift_evidence(text)
    fws = ev.get("frameworks", [])
    between = f" between {' and '.join(fws)}" if len(fws) >= 2 else (f" ({fws[0]})" if fws else "")
    nums = ", ".join(f"{k.replace('_', ' ')} {ev[k]:g}" for k in ("max_abs_diff", "tolerance") if k in ev)
    fix = (
        "run the original and the converted model on the same input and compare per output (`usg doctor parity`); "
        "check the export ran with model.eval(), the ops whose attributes differ between frameworks (Resize "
        "coordinate mode, normalization epsilon), and the precision (fp16/int8 widen differences)"
    )
    return Explained(f"the outputs differ{between}" + (f": {nums}" if nums else ""), fix, ev)
