"""Markdown tables from a `usg bench --json` report (for benchmarks/README.md).

python benchmarks/report_md.py REPORT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _num(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def main(path: str) -> None:
    text = Path(path).read_text()
    doc = json.loads(text[text.index("{") :])  # tolerate stray lines before the JSON
    print("| system | clients | completed | req/s | p50 ms | p95 ms | p99 ms | errors | rejected |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in doc["results"]:
        level = r["concurrency"] if r["mode"] == "closed" else f"{r['rate']} req/s"
        print(
            f"| {r['system']} | {level} | {r['completed']} | {r['throughput_rps']:.2f} | {r['p50_ms']:.0f} | "
            f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['error_rate']:.0%} | {r['rejection_rate']:.0%} |"
        )
    print()
    print("| baseline | clients | same outputs | USG throughput × | baseline p95 / USG p95 |")
    print("|---|---:|---|---:|---:|")
    for row in doc["ratios"]:
        eq = doc["equivalence"].get(row["system"], {})
        same = "yes" if eq.get("ok") else "NO"
        ratio = "refused" if row["refused"] else f"{row['throughput_ratio']:.2f}×"
        print(
            f"| {row['system']} | {row['level']:g} | {same} ({eq.get('samples', 0)} samples) | {ratio} | "
            f"{_num(row['p95_ratio'], '.2f')}× |"
        )
    for label, models in doc["breakdown"].items():
        print()
        print(f"Per-model breakdown, {label}:")
        print()
        print("| model | items/request | calls | mean batch | queue ms/item | compute ms/call | padding waste |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m in models:
            print(
                f"| {m['model']} | {_num(m['items_per_request'], '.2f')} | {m['calls']} | "
                f"{_num(m['mean_batch'], '.2f')} | {_num(m['queue_ms_mean'], '.1f')} | "
                f"{_num(m['compute_ms_mean'], '.1f')} | {m['padding_waste']:.1%} |"
            )
    bound = doc.get("bound")
    if bound:
        print()
        print(
            f"Model-only bound: {bound['bound_rps']:.2f} req/s ({bound['basis']}); bottleneck "
            f"{bound['bottleneck']} ({bound.get('bottleneck_share', 0):.0%} of model CPU per request)."
        )
        print()
        if "serial_bound_rps" in bound:
            usg = [r for r in doc["results"] if r["system"] == "usg"]
            frac = ""
            if usg:
                share = usg[-1]["throughput_rps"] / bound["serial_bound_rps"]
                frac = f"; USG at {usg[-1]['concurrency']} clients: {share:.0%} of it"
            print(
                f"\nWithout any overlap between models (sum of their times, last measurement): "
                f"{bound['serial_bound_rps']:.2f} req/s{frac}."
            )
        print()
        print("| model | items/request | items/s (machine) | req/s it alone can serve | batch | threads | instances |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, m in bound["per_model"].items():
            print(
                f"| {name} | {m['items_per_request']:.2f} | {m['machine_items_per_s']:.1f} | "
                f"{1e3 / m['ms_per_request']:.2f} | {m['batch']} | {m['threads']} | {m['instances']} |"
            )
        for m in bound.get("measurements") or []:
            print(
                f"\nBound measured right after USG's run at {m['level']:g} clients: {m['bound_rps']:.2f} req/s; "
                f"USG reached {m['achieved']:.0%} of it."
            )
        for level, frac in (bound.get("achieved") or {}).items():
            print(f"\nUSG at {level} clients: {frac:.0%} of the bound.")


if __name__ == "__main__":
    main(sys.argv[1])
