"""Per-hop executor overhead: USG's in-process executor vs Ray Serve handles, same machine, same run.

    python benchmarks/executor_overhead.py [--nodes 10] [--requests 2000] [--json]

A chain of N no-op Python nodes (USG) and a chain of N no-op Ray Serve deployments calling
each other through DeploymentHandles; one request at a time; p50 latency / N is the per-hop
overhead. Prints the ratio Ray / USG (goal: USG ≤ 1/20 of Ray Serve's, i.e. ratio ≥ 20).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from usg.bench.overhead import measure_ray, measure_usg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000, help="USG requests (Ray gets a tenth, min 200)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    usg = asyncio.run(measure_usg(args.nodes, args.requests))
    ray = measure_ray(args.nodes, max(200, args.requests // 10))
    ratio = ray["per_hop_us"] / usg["per_hop_us"]
    if args.json:
        print(json.dumps({"nodes": args.nodes, "usg": usg, "ray_serve": ray, "ray_over_usg_per_hop": ratio}, indent=2))
        return
    print(f"chain of {args.nodes} no-op nodes, one request at a time")
    print(
        f"  USG        p50 chain {usg['chain_p50_us']:9.1f} µs   per hop {usg['per_hop_us']:8.1f} µs   "
        f"(marginal per hop {usg['marginal_per_hop_us']:.1f} µs)"
    )
    print(
        f"  Ray Serve  p50 chain {ray['chain_p50_us']:9.1f} µs   per hop {ray['per_hop_us']:8.1f} µs   "
        f"(single handle call {ray['single_call_p50_us']:.1f} µs)"
    )
    print(f"  USG per-hop overhead is 1/{ratio:.1f} of Ray Serve's (goal ≥ 20)")


if __name__ == "__main__":
    main()
