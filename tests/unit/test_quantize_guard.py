"""The accuracy guard: parsing, metrics per output type, defaults, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from usg.bench.samples import Sample
from usg.errors import UsageError
from usg.quantize.guard import Guard, char_accuracy, default_guards, evaluate, levenshtein, output_kind, parse_guard
from usg.quantize.runner import split_samples


def test_parse_guard_reads_output_metric_op_threshold():
    assert parse_guard("lines:char_accuracy>=0.99") == Guard("lines", "char_accuracy", ">=", 0.99)
    assert parse_guard(" out : max_rel <= 5e-2 ") == Guard("out", "max_rel", "<=", 0.05)
    assert str(parse_guard("e:cosine>=0.995")) == "e:cosine>=0.995"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("lines>=0.99", r"not OUTPUT:METRIC>=X; fix: e.g. --guard lines:char_accuracy>=0.99"),
        ("lines:accuracy>=0.99", r"unknown metric 'accuracy'; fix: use one of char_accuracy, cosine"),
        ("lines:cosine>=abc", r"not OUTPUT:METRIC>=X"),
    ],
)
def test_bad_guards_say_the_fix(text, match):
    with pytest.raises(UsageError, match=match):
        parse_guard(text)


def test_levenshtein_and_char_accuracy():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    # 1 substitution in 10 reference characters, 0 in the other 5
    assert char_accuracy(["Order 7781", "Total"], ["Order 7181", "Total"]) == pytest.approx(1 - 1 / 15)
    assert char_accuracy([""], [""]) == 1.0
    assert char_accuracy(["abc"], [""]) == 0.0


def test_output_kinds():
    assert output_kind([{"text": "a", "score": 0.9}]) == "text"
    assert output_kind("a\nb") == "text"
    e = np.ones((2, 4), np.float32) / 2.0  # unit rows
    assert output_kind(e) == "embedding"
    assert output_kind(np.arange(6, dtype=np.float32).reshape(2, 3)) == "tensor"
    assert output_kind(None) is None and output_kind({"x": 1}) is None


def lines(*texts: str) -> list[dict[str, object]]:
    return [{"text": t, "score": 0.9, "box": []} for t in texts]


def test_text_metrics_against_fp32():
    ref = [{"lines": lines("Invoice 55012", "Bank transfer only")}, {"lines": lines("Thank you")}]
    hyp = [{"lines": lines("Invoice 55O12", "Bank transfer only")}, {"lines": lines("Thank you")}]
    r = evaluate(ref, hyp, [Guard("lines", "char_accuracy", ">=", 0.99), Guard("lines", "exact_line_rate", ">=", 0.5)])
    n = len("Invoice 55012\nBank transfer only") + len("Thank you")
    assert r.metrics["lines"]["char_accuracy"] == pytest.approx(1 - 1 / n)
    assert r.metrics["lines"]["exact_line_rate"] == pytest.approx(2 / 3)
    assert [str(g) for g in r.failed] == ["lines:char_accuracy>=0.99"]  # 1 - 1/41 < 0.99
    assert not r.holds and r.shortfall == pytest.approx(0.99 - (1 - 1 / n))


def test_embedding_and_tensor_metrics():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(3, 8))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    noisy = e + rng.normal(scale=0.05, size=e.shape)
    t = rng.normal(size=(2, 5)).astype(np.float32) * 3
    ref = [{"emb": e.astype(np.float32), "t": t}]
    hyp = [{"emb": noisy.astype(np.float32), "t": t + 0.03}]
    guards = [Guard("emb", "cosine", ">=", 0.9999), Guard("t", "max_abs", "<=", 0.05)]
    r = evaluate(ref, hyp, guards)
    cos = (e * noisy).sum(1) / np.linalg.norm(noisy, axis=1)
    assert r.metrics["emb"]["cosine"] == pytest.approx(cos.mean(), rel=1e-5)
    assert r.metrics["emb"]["min_cosine"] == pytest.approx(cos.min(), rel=1e-5)
    assert r.metrics["t"]["max_abs"] == pytest.approx(0.03, rel=1e-3)
    assert r.metrics["t"]["max_rel"] == pytest.approx(0.03 / np.abs(t).max(), rel=1e-3)
    assert r.failed == [guards[0]]


def test_missing_candidate_output_counts_as_a_miss():
    e = np.eye(2, dtype=np.float32)
    r = evaluate([{"emb": e}], [{}], [Guard("emb", "cosine", ">=", 0.5)])
    assert r.metrics["emb"]["cosine"] == 0.0 and not r.holds
    r2 = evaluate([{"t": np.ones((1, 3), np.float32) * 2}], [{}], [Guard("t", "max_rel", "<=", 1.0)])
    assert r2.metrics["t"]["max_rel"] == float("inf")


def test_default_guards_per_output_type():
    e = np.eye(3, dtype=np.float32)
    ref = [{"lines": lines("a"), "emb": e, "t": np.full((1, 2), 3.0, np.float32)}]
    assert [str(g) for g in default_guards(ref)] == [
        "lines:char_accuracy>=0.99",
        "emb:cosine>=0.99",
        "t:max_rel<=0.05",
    ]


def test_guard_on_an_unknown_or_mismatched_output_is_refused():
    ref = [{"lines": lines("a")}]
    with pytest.raises(UsageError, match=r"no comparable output 'emb'.*fix: guard one of lines"):
        evaluate(ref, ref, [Guard("emb", "cosine", ">=", 0.9)])
    with pytest.raises(UsageError, match=r"'lines' is a text output; fix: use one of char_accuracy, exact_line_rate"):
        evaluate(ref, ref, [Guard("lines", "cosine", ">=", 0.9)])


def test_split_samples_holds_some_back():
    samples = [Sample(f"s{i}", text=str(i)) for i in range(8)]
    calib, held = split_samples(samples, 0.25)
    assert len(held) == 2 and len(calib) == 6
    assert not {s.name for s in calib} & {s.name for s in held}
    with pytest.raises(UsageError, match="needs at least 2"):
        split_samples(samples[:1], 0.25)
    with pytest.raises(UsageError, match=r"--holdout 1\.5: must be between 0 and 1"):
        split_samples(samples, 1.5)
