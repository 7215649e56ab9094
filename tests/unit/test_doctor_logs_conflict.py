"""usg doctor logs: a message whose closest known cases were resolved by different causes is not given one of them
by the learned layer (below CONFLICT_CONFIDENCE); the finding stays unclassified and names the candidate causes with
the cases that had them.

The excerpts are real messages users pasted in public threads (the thread is named beside each)."""

from __future__ import annotations

from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase
from usg.doctor.logs.similar import (
    CONFLICT_CONFIDENCE,
    CONFLICT_SIMILARITY,
    CaseIndex,
    Neighbour,
    conflicting_causes,
)


def _case(n: int, cause: RootCause, text: str, resolution: str = "r") -> LabelledCase:
    return LabelledCase(f"https://github.com/o/r/issues/{n}", "p", cause, resolution, False, text)


# "Tokenizer class X does not exist or is not currently imported": three threads, three causes
TOKENIZER = [
    # hyn2028/llm-cxr#8: the installed transformers was too old (upgrading fixed it)
    _case(
        1,
        RootCause.VERSION_COUPLING,
        "ValueError: Tokenizer class GPTNeoXTokenizer does not exist or is not currently imported.",
        "upgrade transformers",
    ),
    # huggingface/transformers#9250: sentencepiece was not installed
    _case(
        2,
        RootCause.ENVIRONMENT,
        "ValueError: Tokenizer class T5Tokenizer does not exist or is not currently imported.",
        "pip install sentencepiece",
    ),
    # baichuan-inc/Baichuan-13B#190: the model repo's own tokenizer needs trust_remote_code=True
    _case(
        3,
        RootCause.CONFIG_INVALID,
        'transformers/models/auto/tokenization_auto.py", line 733, in from_pretrained\n    raise ValueError(\n'
        "ValueError: Tokenizer class BaichuanTokenizer does not exist or is not currently imported.",
        "trust_remote_code=True",
    ),
]
OTHERS = [
    _case(10, RootCause.MEMORY, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    _case(11, RootCause.UNSUPPORTED_OP, "ValueError: Model architectures ['FooForCausalLM'] are not supported for now"),
    _case(12, RootCause.DTYPE_OR_RANGE, "INVALID_ARGUMENT : Unexpected input data type. Actual: (tensor(double))"),
]


def _neighbour(n: int, cause: RootCause, similarity: float) -> Neighbour:
    return Neighbour(_case(n, cause, "x"), similarity)


def test_close_cases_with_different_causes_are_a_conflict_ordered_by_similarity() -> None:
    near = [
        _neighbour(1, RootCause.ENVIRONMENT, 0.62),
        _neighbour(2, RootCause.VERSION_COUPLING, 0.58),
        _neighbour(3, RootCause.VERSION_COUPLING, 0.55),
        _neighbour(4, RootCause.MEMORY, 0.40),  # more than CONFLICT_GAP below the nearest: not counted
    ]
    assert conflicting_causes(near) == [RootCause.VERSION_COUPLING, RootCause.ENVIRONMENT]


def test_agreeing_or_distant_cases_are_no_conflict() -> None:
    agree = [_neighbour(1, RootCause.MEMORY, 0.7), _neighbour(2, RootCause.MEMORY, 0.66)]
    assert conflicting_causes(agree) == []
    low = CONFLICT_SIMILARITY - 0.05  # not close enough to say anything about this message
    distant = [_neighbour(1, RootCause.MEMORY, low), _neighbour(2, RootCause.ENVIRONMENT, low - 0.01)]
    assert conflicting_causes(distant) == []
    assert conflicting_causes([]) == []


def test_a_message_known_with_several_causes_stays_unclassified_and_names_them() -> None:
    # OpenGVLab/InternVL#116 (trust_remote_code) pasted the same message; the three known threads disagree
    index = CaseIndex(TOKENIZER + OTHERS)
    text = "ValueError: Tokenizer class InternLM2Tokenizer does not exist or is not currently imported."
    pred = index.predict(text)
    assert pred.root_cause is None and pred.confidence < CONFLICT_CONFIDENCE
    assert len(pred.candidates) >= 2
    assert set(pred.candidates) <= {RootCause.VERSION_COUPLING, RootCause.ENVIRONMENT, RootCause.CONFIG_INVALID}
    root = root_error(classify_text(text, "app.log", index=index))
    assert root is not None and root.code == "LOG000" and root.root_cause is RootCause.UNCLASSIFIED
    assert root.evidence["candidate_causes"] == [c.value for c in pred.candidates]
    assert "different causes" in root.message
    assert all(f"/issues/{n}" in root.fix for n in (1, 2, 3) if TOKENIZER[n - 1].root_cause in pred.candidates)


def test_a_message_whose_close_cases_agree_is_still_classified() -> None:
    # the same index, a message only the out-of-memory case resembles
    index = CaseIndex(TOKENIZER + OTHERS)
    text = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"
    assert index.predict(text).candidates == []
    root = root_error(classify_text(text, "app.log", index=index))
    assert root is not None and root.root_cause is RootCause.MEMORY
    assert "candidate_causes" not in root.evidence


def test_a_conflict_orders_the_candidates_by_how_many_close_cases_had_each() -> None:
    # nine known cases of one cause and one of another, all alike: still a conflict below CONFLICT_CONFIDENCE, the
    # majority cause first
    alike = "ValueError: Tokenizer class T5Tokenizer does not exist or is not currently imported."
    cases = [_case(20 + i, RootCause.ENVIRONMENT, alike) for i in range(9)]
    cases.append(_case(40, RootCause.VERSION_COUPLING, alike))
    pred = CaseIndex(cases + OTHERS).predict(alike)
    assert pred.confidence < CONFLICT_CONFIDENCE and pred.root_cause is None
    assert pred.candidates == [RootCause.ENVIRONMENT, RootCause.VERSION_COUPLING]
    assert [n.case.root_cause for n in pred.neighbours] == pred.candidates
