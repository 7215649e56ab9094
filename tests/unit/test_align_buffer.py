"""The timestamp-aligned join buffer: pairing rules, waiting, drop mode, stats, and hypothesis properties."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from usg.errors import InputError, UsageError  # noqa: E402
from usg.runtime.align import AlignBuffer  # noqa: E402

TOL, WAIT = 300.0, 500.0


def test_a_complete_pair_goes_out_once_no_nearer_item_can_come() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT)
    buf.push("frame", 1000, "f1", now_ms=1000)
    assert buf.poll(1000) == []  # no audio yet: wait
    buf.push("audio", 1200, "a1", now_ms=1250)
    assert buf.poll(1250) == []  # a frame before 1400 would be nearer to the audio item
    buf.push("frame", 1450, "f2", now_ms=1450)  # the frame stream moved past 1400: decide
    (t,) = buf.poll(1450)
    assert t.items == {"audio": "a1", "frame": "f1"} and t.missing == () and t.skew_ms == 200
    assert len(buf) == 1 and buf.stats.skews_ms == [200]


def test_a_complete_pair_goes_out_at_the_deadline_without_more_items() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT)
    buf.push("audio", 1000, "a1", now_ms=1000)
    buf.push("frame", 1000, "f1", now_ms=1000)
    (t,) = buf.poll(1000)  # equal times: nothing can be nearer
    assert t.skew_ms == 0 and t.missing == ()


def test_a_missing_stream_is_waited_for_until_tolerance_plus_max_wait_then_partial() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT)
    buf.push("frame", 1000, "f1", now_ms=1000)
    assert buf.poll(1799) == []
    (t,) = buf.poll(1800)
    assert t.items == {"frame": "f1"} and t.missing == ("audio",)
    assert buf.stats.missing_rate("audio") == 1.0 and buf.stats.missing_rate("frame") == 0.0


def test_out_of_tolerance_items_are_not_paired() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT)
    buf.push("audio", 0, "a", now_ms=0)
    buf.push("frame", 301, "f", now_ms=301)
    out = buf.flush()
    assert [t.missing for t in out] == [("frame",), ("audio",)]


def test_mutual_nearest_a_dense_stream_does_not_steal_the_partner() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT)
    for ts in (900, 1000, 1100):
        buf.push("frame", ts, f"f{ts}")
    buf.push("audio", 1010, "a")
    out = buf.flush()
    assert [(t.items.get("frame"), t.items.get("audio")) for t in out] == [
        ("f900", None),
        ("f1000", "a"),
        ("f1100", None),
    ]


def test_drop_mode_counts_dropped_items_and_late_arrivals() -> None:
    buf = AlignBuffer(["audio", "frame"], tolerance_ms=TOL, max_wait_ms=WAIT, on_missing="drop")
    buf.push("frame", 0, "f0", now_ms=0)
    assert buf.poll(900) == []  # dropped, not returned
    buf.push("audio", 100, "a", now_ms=2000)  # 1.9 s after capture: late
    buf.flush()
    s = buf.stats
    assert s.dropped == {"audio": 1, "frame": 1} and s.late == {"audio": 1, "frame": 0}
    assert s.tuples == 2 and s.dropped_tuples == 2


def test_pending_items_are_bounded() -> None:
    buf = AlignBuffer(["a", "b"], tolerance_ms=TOL, max_wait_ms=WAIT, max_pending=3)
    for i in range(10):
        buf.push("a", i * 1000, i, now_ms=0)
    assert len(buf) == 3
    assert [t.items["a"] for t in buf.poll(0)] == list(range(7))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(UsageError, match=r"two or more distinct streams"):
        AlignBuffer(["a"])
    with pytest.raises(UsageError, match=r"on_missing is 'keep'; use 'partial' or 'drop'"):
        AlignBuffer(["a", "b"], on_missing="keep")  # type: ignore[arg-type]
    buf = AlignBuffer(["a", "b"])
    with pytest.raises(InputError, match=r"align: unknown stream 'c'; fix: use one of: a, b"):
        buf.push("c", 0, None)
    with pytest.raises(InputError, match=r"a: timestamp nan is not finite"):
        buf.push("a", float("nan"), None)


# -- properties ------------------------------------------------------------------------------
SPACING = 4 * TOL  # true events far enough apart that no item is within tolerance of another event


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[str], list[tuple[float, str, float, tuple[int, str]]]]:
    """Events at k * SPACING; each stream sees each event with probability, its capture time jittered by
    up to T/2 (so two items of one event are within T), its arrival delayed by up to max_wait."""
    streams = ["audio", "frame", "text"][: draw(st.integers(2, 3))]
    n_events = draw(st.integers(1, 12))
    items = []
    for k in range(n_events):
        for s in streams:
            if draw(st.booleans()) or draw(st.booleans()):
                ts = k * SPACING + draw(st.floats(-TOL / 2, TOL / 2))
                arrival = ts + draw(st.floats(0, WAIT))
                items.append((arrival, s, ts, (k, s)))
    order = draw(st.permutations(range(len(items))))
    items = [items[i] for i in order]
    items.sort(key=lambda x: x[0])  # pushed in arrival order: out of order across and within streams
    return streams, items


def _run(
    streams: list[str], items: list[tuple[float, str, float, tuple[int, str]]], mode: str
) -> tuple[list, AlignBuffer]:
    buf = AlignBuffer(streams, tolerance_ms=TOL, max_wait_ms=WAIT, on_missing=mode)  # type: ignore[arg-type]
    out = []
    for arrival, s, ts, tag in items:
        buf.push(s, ts, tag, now_ms=arrival)
        out += buf.poll(arrival)
    out += buf.flush()
    return out, buf


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_every_true_tuple_is_matched_none_across_events_no_item_lost_or_duplicated(sc) -> None:  # type: ignore[no-untyped-def]
    streams, items = sc
    out, buf = _run(streams, items, "partial")
    seen = [tag for t in out for tag in t.items.values()]
    assert sorted(seen) == sorted(tag for *_, tag in items)  # each item exactly once
    for t in out:
        events = {k for k, _ in t.items.values()}
        assert len(events) == 1  # never across events
        assert t.skew_ms <= TOL
        (k,) = events
        assert set(t.missing) == set(streams) - {s for kk, s in (tag for *_, tag in items) if kk == k}
    assert buf.stats.late == dict.fromkeys(streams, 0) and sum(buf.stats.dropped.values()) == 0


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_drop_mode_keeps_complete_tuples_and_counts_every_other_item(sc) -> None:  # type: ignore[no-untyped-def]
    streams, items = sc
    out, buf = _run(streams, items, "drop")
    assert all(not t.missing and len(t.items) == len(streams) for t in out)
    kept = sum(len(t.items) for t in out)
    assert kept + sum(buf.stats.dropped.values()) == len(items)
    assert buf.stats.tuples == len(out) + buf.stats.dropped_tuples


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 5000), st.floats(0, 2 * WAIT)), max_size=40),
    st.floats(0, 400),
)
def test_arbitrary_times_never_pair_beyond_tolerance_and_keep_every_item(raw, tol) -> None:  # type: ignore[no-untyped-def]
    buf = AlignBuffer(["a", "b"], tolerance_ms=tol, max_wait_ms=WAIT)
    out = []
    for i, (s, ts, delay) in sorted(enumerate(raw), key=lambda x: x[1][1] + x[1][2]):
        buf.push(s, ts, i, now_ms=ts + delay)
        out += buf.poll(ts + delay)
    out += buf.flush()
    assert sorted(i for t in out for i in t.items.values()) == list(range(len(raw)))
    assert all(t.skew_ms <= tol for t in out)
    assert all(set(t.items) | set(t.missing) == {"a", "b"} for t in out)
