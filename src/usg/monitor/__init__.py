"""Monitoring in the graph: reference profiles, live drift, a health score, SLO attribution.

- :func:`build_profile` (``usg profile``): per-input statistics of each modality and the
  distributions of the node outputs the graph's ``monitor:`` section names, tied to the graph's
  and models' SHA-256.
- :func:`compare_profiles` (``usg drift``, and live in ``usg serve --reference``): KS, PSI,
  chi-square, MMD permutation tests and KL from scipy.
- :class:`LiveMonitor`: sliding windows, ``GET /v1/monitor``, Prometheus gauges, health score.
- :mod:`usg.monitor.slo` (``usg report slo``): per-node, per-cause attribution of SLO violations
  from USG's spans (``usg serve --trace-file``) or OTLP JSON from Jaeger / Tempo.
"""

from __future__ import annotations

from usg.monitor.config import MonitorConfig, OutputWatch, Thresholds, WindowSpec, monitor_config, parse_monitor
from usg.monitor.drift import compare_profiles
from usg.monitor.health import health_score
from usg.monitor.profile import build_profile, load_profile, write_profile

__all__ = [
    "MonitorConfig",
    "OutputWatch",
    "Thresholds",
    "WindowSpec",
    "build_profile",
    "compare_profiles",
    "health_score",
    "load_profile",
    "monitor_config",
    "parse_monitor",
    "write_profile",
]
