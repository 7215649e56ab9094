"""CLI edges of the monitoring commands: refusals name the fix; identical profiles do not drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("scipy")

from click.testing import CliRunner

from usg.cli import cli, main
from usg.errors import UsageError

MONITOR = Path(__file__).resolve().parents[1] / "resources" / "monitor"


def _profile(tmp_path: Path) -> Path:
    import sys

    sys.path.insert(0, str(MONITOR))
    from usg.graph import load_graph
    from usg.monitor.profile import build_profile, write_profile

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "t.jsonl").write_text("\n".join(json.dumps({"text": f"total due {i}"}) for i in range(30)))
    out = tmp_path / "ref.json"
    write_profile(build_profile(load_graph(MONITOR / "graph.yaml"), folder), out)
    return out


def test_identical_profiles_do_not_drift(tmp_path: Path) -> None:
    ref = _profile(tmp_path)
    res = CliRunner().invoke(cli, ["drift", str(ref), str(ref), "--json"], standalone_mode=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["drift"] is False


def test_serve_refuses_monitoring_on_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = _profile(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(MONITOR / "graph.yaml"), "--engine", "ray", "--reference", str(ref)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--reference and --trace-file work with the embedded engine; fix: drop --engine ray" in err


def test_report_needs_html_or_pdf(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from usg.monitor.otlp import read_traces
    from usg.monitor.slo import attribute, parse_slo
    from usg.monitor.slo_report import write_report

    line = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "a" * 32,
                                "spanId": "b" * 16,
                                "name": "usg.request",
                                "startTimeUnixNano": "1000000000",
                                "endTimeUnixNano": "1900000000",
                            }
                        ]
                    }
                ]
            }
        ]
    }
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(line))
    reqs = read_traces([trace])
    data = attribute(reqs, parse_slo("p95<800ms"))
    assert data["violating"] == 1 and data["budget"]["per_node"] == {"(executor)": 1.0}
    with pytest.raises(UsageError, match=r"unknown report format '\.png'; fix: end the name in \.html or \.pdf"):
        write_report(data, reqs, tmp_path / "r.png")


def _mutated(ref: Path, tmp_path: Path, name: str, edit) -> Path:
    doc = json.loads(ref.read_text())
    edit(doc)
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("inputs-a-list", lambda d: d.__setitem__("inputs", [1]), "inputs is a list, not an object"),
        ("no-outputs", lambda d: d.pop("outputs"), "outputs is missing, not an object"),
        (
            "text-in-a-sample",
            lambda d: d["inputs"]["text"]["numeric"]["characters"]["sample"].__setitem__(0, "a"),
            "inputs.text.numeric.characters.sample[0] is 'a', not a number",
        ),
        ("count-a-string", lambda d: d.__setitem__("count", "x"), "count is 'x', not a count"),
        (
            "short-embedding-row",
            lambda d: d["outputs"]["embedding"]["sample"][2].pop(),
            "outputs.embedding.sample[2] has 15 values, dim says 16",
        ),
        (
            "edges-backwards",
            lambda d: d["outputs"]["score"]["histogram"].__setitem__("edges", [1, 0]),
            "outputs.score.histogram has 2 edges (increasing?) for 10 counts",
        ),
    ],
)
def test_a_damaged_profile_names_the_field_instead_of_crashing_or_comparing_in_part(
    tmp_path: Path, name: str, edit, message: str
) -> None:
    """Each of these was an internal error (AttributeError, ValueError) or — a missing section — a
    comparison of what was left that reported no drift."""
    ref = _profile(tmp_path)
    window = _mutated(ref, tmp_path, name, edit)
    res = CliRunner().invoke(cli, ["drift", str(ref), str(window)], standalone_mode=False)
    assert isinstance(res.exception, UsageError), res.output
    assert message in str(res.exception) and "fix: write it again with `usg profile`" in str(res.exception)


def test_a_profile_nested_past_the_parser_limit_is_unreadable_json(tmp_path: Path) -> None:
    ref = _profile(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    res = CliRunner().invoke(cli, ["drift", str(ref), str(deep)], standalone_mode=False)
    assert isinstance(res.exception, UsageError) and "not readable JSON (nested too deep)" in str(res.exception)


def test_nan_values_a_model_emitted_are_data_not_damage(tmp_path: Path) -> None:
    """A window from GET /v1/monitor/window writes a NaN as null (usg.monitor.http.jsonable): it was refused
    as a damaged profile; the drift tests read null as NaN, as they read it before profiles were checked."""
    from usg.monitor.http import jsonable

    ref = _profile(tmp_path)
    doc = json.loads(ref.read_text())
    doc["outputs"]["score"]["values"]["sample"][0] = float("nan")
    doc["outputs"]["embedding"]["sample"][0][0] = doc["outputs"]["embedding"]["centroid"][0] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(doc))  # json writes it as NaN
    (tmp_path / "null.json").write_text(json.dumps(jsonable(doc)))  # the endpoint writes null
    assert json.loads((tmp_path / "null.json").read_text())["outputs"]["score"]["values"]["sample"][0] is None
    for name in ("nan.json", "null.json"):
        res = CliRunner().invoke(cli, ["drift", str(ref), str(tmp_path / name)], standalone_mode=False)
        assert res.exit_code in (0, 1) and isinstance(res.exception, (SystemExit, type(None))), (name, res.exception)


def test_a_window_given_as_the_reference_is_refused_as_swapped_arguments(tmp_path: Path) -> None:
    """`usg drift window.json ref.json` (the arguments swapped) compared the reference against the
    window and printed a drift table, exit 0; a window from GET /v1/monitor/window says what it is."""
    ref = _profile(tmp_path)
    doc = json.loads(ref.read_text())
    window = tmp_path / "window.json"
    window.write_text(json.dumps({**{k: v for k, v in doc.items() if k not in ("failed", "monitor")}, "window": True}))
    res = CliRunner().invoke(cli, ["drift", str(ref), str(window)], standalone_mode=False)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # the right order runs
    with pytest.raises(UsageError, match=r"the two are swapped; fix: usg drift .*ref\.json .*window\.json$"):
        CliRunner().invoke(cli, ["drift", str(window), str(ref)], standalone_mode=False, catch_exceptions=False)
