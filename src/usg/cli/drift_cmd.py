"""``usg drift ref.json window.json``: compare two profiles offline (exit 1 when drift is found)."""

from __future__ import annotations

import json
import sys

import click

from usg.cli.common import FiniteFloatRange, out_console
from usg.errors import UsageError

__all__ = ["drift"]


@click.command("drift")
@click.argument("reference", type=click.Path(dir_okay=False))
@click.argument("window", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option(
    "--p-value",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Test level per family (default: the reference's, else 0.01).",
)
def drift(reference: str, window: str, as_json: bool, p_value: float | None) -> None:
    """Run the drift tests of WINDOW (a profile, or GET /v1/monitor/window) against REFERENCE."""
    from rich.table import Table

    from usg.monitor.config import Thresholds
    from usg.monitor.drift import compare_profiles
    from usg.monitor.profile import load_profile

    ref, cur = load_profile(reference), load_profile(window)
    if ref.get("window") is True and cur.get("window") is not True:
        # a window (GET /v1/monitor/window) given as the reference and the reference as the window:
        # the tests would run the other way round and report the reference's drift from the window
        raise UsageError(
            f"REFERENCE {reference} is a serving window (from GET /v1/monitor/window) and WINDOW {window} "
            f"is not: the two are swapped; fix: usg drift {window} {reference}"
        )
    saved = {k: v for k, v in ref.get("monitor", {}).get("thresholds", {}).items() if k in Thresholds.__annotations__}
    if p_value is not None:
        saved["p_value"] = p_value
    thresholds = Thresholds(
        p_value=float(saved.get("p_value", 0.01)),
        psi=float(saved.get("psi", 0.2)),
        kl=float(saved.get("kl", 0.05)),
        cosine=float(saved.get("cosine", 0.02)),
        permutations=int(saved.get("permutations", 499)),
    )
    result = compare_profiles(ref, cur, thresholds)
    if as_json:
        from usg.monitor.http import jsonable

        click.echo(json.dumps(jsonable(result), indent=1))
    else:
        table = Table(
            title=f"drift: {len(result['drifted'])} finding(s) (window {result['window_count']} vs "
            f"reference {result['reference_count']})"
        )
        for col in ("where", "test", "statistic", "p-value", "effect", "drift"):
            table.add_column(col)
        for t in result["features"]:
            table.add_row(
                f"{t['input']}.{t['feature']}",
                t["test"],
                f"{t.get('statistic', float('nan')):.3g}",
                f"{t['p_value']:.3g}",
                f"PSI {t['psi']:.3f}",
                "yes" if t["drift"] else "",
            )
        for t in result["outputs"]:
            if "skipped" in t:
                table.add_row(t["output"], t["kind"], "", "", t["skipped"], "")
            elif t["kind"] == "embedding":
                table.add_row(
                    t["output"],
                    "mmd",
                    f"{t['mmd2']:.3g}",
                    f"{t['mmd_p_value']:.3g}",
                    f"cos shift {t['centroid_cosine_shift']:.3f}",
                    "yes" if t["drift"] else "",
                )
            else:
                table.add_row(
                    t["output"],
                    "ks",
                    f"{t['ks']:.3g}",
                    f"{t['p_value']:.3g}",
                    f"KL {t['kl']:.3f}",
                    "yes" if t["drift"] else "",
                )
        out_console.print(table)
    sys.exit(1 if result["drift"] else 0)
