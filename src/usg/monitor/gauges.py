"""Prometheus gauges of the live monitor, collected at scrape time from its latest results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from usg.monitor.live import LiveMonitor

__all__ = ["MonitorCollector"]


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else float("nan")


class MonitorCollector(Collector):
    """``usg_drift_*`` (latest evaluated window) and ``usg_health_*`` (computed at scrape)."""

    def __init__(self, monitor: LiveMonitor) -> None:
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        """Nothing at registration (collect() reads the monitor, which the registry's lock must not wait on)."""
        return []

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        latest = m.latest or {}
        yield GaugeMetricFamily(
            "usg_drift_detected",
            "1 when the latest evaluated window drifted from the reference.",
            value=1.0 if latest.get("drift") else 0.0,
        )
        yield GaugeMetricFamily("usg_drift_evaluations", "Windows compared with the reference.", value=m.evaluations)
        yield GaugeMetricFamily("usg_monitor_dropped", "Observations dropped (monitor behind).", value=m.dropped)
        labels = ["input", "feature"]
        p = GaugeMetricFamily(
            "usg_drift_feature_p_value", "KS / chi-square p-value of an input feature.", labels=labels
        )
        s = GaugeMetricFamily("usg_drift_feature_psi", "PSI of an input feature against the reference.", labels=labels)
        f = GaugeMetricFamily("usg_drift_feature_drift", "1 when the input feature drifted.", labels=labels)
        for t in latest.get("features", []):
            key = [t["input"], t["feature"]]
            p.add_metric(key, _num(t["p_value"]))
            s.add_metric(key, _num(t["psi"]))
            f.add_metric(key, 1.0 if t["drift"] else 0.0)
        yield from (p, s, f)
        cos = GaugeMetricFamily(
            "usg_drift_embedding_cosine_shift", "1 - cos(reference, window centroid).", labels=["output"]
        )
        mmd = GaugeMetricFamily("usg_drift_embedding_mmd_p_value", "MMD permutation-test p-value.", labels=["output"])
        kl = GaugeMetricFamily("usg_drift_output_kl", "KL(window || reference) of a score output.", labels=["output"])
        od = GaugeMetricFamily("usg_drift_output_drift", "1 when the output's distribution drifted.", labels=["output"])
        for t in latest.get("outputs", []):
            if "skipped" in t:
                continue
            if t["kind"] == "embedding":
                cos.add_metric([t["output"]], _num(t["centroid_cosine_shift"]))
                mmd.add_metric([t["output"]], _num(t["mmd_p_value"]))
            else:
                kl.add_metric([t["output"]], _num(t["kl"]))
            od.add_metric([t["output"]], 1.0 if t.get("drift") else 0.0)
        yield from (cos, mmd, kl, od)
        health = m.health()
        yield GaugeMetricFamily("usg_health_score", "Deployment health, 0-100.", value=_num(health["score"]))
        score = GaugeMetricFamily(
            "usg_health_component_score", "A health component, 0-1 (NaN: n/a).", labels=["component"]
        )
        value = GaugeMetricFamily(
            "usg_health_component_value", "The measured figure of a component.", labels=["component"]
        )
        weight = GaugeMetricFamily(
            "usg_health_component_weight",
            "Effective weight of a component in the score (0: n/a).",
            labels=["component"],
        )
        for c in health["components"]:
            score.add_metric([c["name"]], _num(c["score"]))
            value.add_metric([c["name"]], _num(c["value"]))
            weight.add_metric([c["name"]], _num(c["effective_weight"]))
        yield from (score, value, weight)
