"""usg.bench: load generation, baselines, reports and plots for ``usg bench``; profiling for ``usg tune``.

``run_bench(BenchConfig, graph)`` returns a :class:`BenchReport`; ``apply_sidecar(graph)`` merges
the ``GRAPH.tuned.yaml`` that ``usg tune`` writes.
"""

from __future__ import annotations

from usg.bench.bound import model_only_bound
from usg.bench.equivalence import compare_outputs
from usg.bench.loadgen import LoadResult, run_closed, run_open
from usg.bench.report import BenchReport, report_json
from usg.bench.runner import BenchConfig, run_bench
from usg.bench.samples import Sample, default_samples, load_samples
from usg.bench.tune import choose
from usg.graph.sidecar import apply_sidecar

__all__ = [
    "BenchConfig",
    "BenchReport",
    "LoadResult",
    "Sample",
    "apply_sidecar",
    "choose",
    "compare_outputs",
    "default_samples",
    "load_samples",
    "model_only_bound",
    "report_json",
    "run_bench",
    "run_closed",
    "run_open",
]
