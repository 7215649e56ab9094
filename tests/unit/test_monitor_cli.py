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
