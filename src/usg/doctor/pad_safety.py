"""Dry-run check that a model a graph declares pad-safe really is (GRAPH023).

A ``batch.pad`` policy is a claim: "padding these axes does not change my outputs".
The batcher relies on it to put items of different lengths in one batch. This check
captures a real item per padded model during a dry run, pads it further along the
declared axes with the declared pad values, runs both, and compares the outputs on
the unpadded positions. A difference above 1e-4 means padded batches would return
different results than single requests — the claim is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.graph_checks import _built, line_for, sample_inputs
from usg.doctor.registry import CodeInfo, check
from usg.doctor.runner import CheckContext

__all__ = ["check_pad_safety", "padding_drift"]

TOLERANCE = 1e-4

C_PAD = CodeInfo(
    "GRAPH023",
    Severity.ERROR,
    RootCause.SHAPE_OR_RANK,
    "dry run: model declared pad-safe changes its output when padded",
    "A model with a batch.pad policy gives different outputs for the same item when it is padded "
    "further along the declared axes, so batches of unequal items would change results.",
)


def _pad_more(item: Mapping[str, Any], pad: Any, extra: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for port, value in item.items():
        axes = pad.axes.get(port, pad.axes.get("*", ()))
        if not axes or not isinstance(value, np.ndarray):
            out[port] = value
            continue
        fill = pad.value.get(port, pad.value.get("*", 0.0))
        widths = [(0, extra if a in axes else 0) for a in range(value.ndim)]
        out[port] = np.pad(value, widths, constant_values=np.array(fill, dtype=value.dtype))
    return out


def padding_drift(backend: Any, item: Mapping[str, Any], pad: Any, extra: int = 16) -> dict[str, float]:
    """Max |difference| per output between ``item`` and ``item`` padded by ``extra`` more elements."""
    plain = backend.infer(dict(item))
    padded = backend.infer(_pad_more(item, pad, extra))
    drift: dict[str, float] = {}
    for name, a in plain.items():
        b = padded.get(name)
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim != b.ndim:
            continue
        overlap = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape, strict=True))
        diff = np.abs(a[overlap].astype(np.float64) - b[overlap].astype(np.float64))
        drift[name] = float(diff.max()) if diff.size else 0.0
    return drift


class _Recording:
    """Wraps a backend and keeps the first batch it runs (one real item of the dry run)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.first: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if self.first is None:
            self.first = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
        out: dict[str, Any] = self.inner.infer(inputs)
        return out


@check("graph", codes=[C_PAD])
def check_pad_safety(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    if not ctx.dry_run:
        return
    built = _built(path, ctx)
    graph = built.graph
    if graph is None:
        return
    padded = {name: m for name, m in graph.models.items() if m.batch.pad is not None}
    if not padded:
        return
    from usg.errors import USGError
    from usg.runtime import Executor
    from usg.runtime.runner import backend_for

    recorders = {name: _Recording(backend_for(m)) for name, m in padded.items()}
    drifts: dict[str, dict[str, float]] = {}
    try:
        with Executor(graph, backends=recorders, batching=False, timeout_s=120.0) as ex:  # type: ignore[arg-type]
            ex.infer_sync(sample_inputs(graph))
            for name, rec in recorders.items():
                if rec.first is not None:
                    drifts[name] = padding_drift(rec.inner, rec.first, padded[name].batch.pad)
    except (USGError, Exception):  # the dry-run check reports run failures; nothing to compare here
        return
    for name, drift in drifts.items():
        pad = padded[name].batch.pad
        assert pad is not None
        worst = max(drift.items(), key=lambda kv: kv[1], default=None)
        if worst is None or worst[1] <= TOLERANCE:
            continue
        where = f"models.{name}.batch.pad"
        yield Finding(
            C_PAD.code,
            C_PAD.severity,
            C_PAD.root_cause,
            f"model {name!r} is declared pad-safe, but padding {dict(pad.axes)} by 16 more elements changes "
            f"output {worst[0]!r} by up to {worst[1]:.3g} (tolerance {TOLERANCE:g})",
            Location(str(path), where, line_for(built.text, where)),
            f"remove models.{name}.batch.pad (only equal shapes will share a batch), or make the model ignore "
            "padded positions (e.g. feed an attention mask and pool with it)",
            evidence={"model": name, "axes": {k: list(v) for k, v in pad.axes.items()}, "drift": drift},
            stage=Stage.DRY_RUN,
        )
