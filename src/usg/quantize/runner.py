"""``quantize_graph``: calibrate through the graph, guard its end outputs, fall back until it holds.

1. The samples are split: ``holdout`` of them (at least one) are only used by the guard.
2. The FP32 graph runs on the calibration samples with a recorder around every ONNX model
   (:func:`usg.bench.tune.capture_items`, the mechanism ``usg tune`` uses), so rec is calibrated
   on the crops det produced and MiniLM on the tokenized OCR lines and queries.
3. Each selected model is quantized alone and the graph (that model swapped in) is compared
   with the FP32 graph on the held-out samples: the per-model sensitivity.
4. While a model's own guard fails, its most harmful nodes (:mod:`usg.quantize.ranking`) —
   1, 2, 4, … of them, or whole op types with ``fallback="op-types"`` — are kept in FP32; a
   model that fails with every quantizable node excluded stays FP32. Then all models together
   are checked, and the one with the least margin is tightened further until the guard holds
   or ``max_trials`` re-quantizations are spent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.backends.base import Backend, BackendState, DelegatingBackend
from usg.bench.samples import Sample
from usg.errors import UsageError
from usg.graph.model import Graph
from usg.quantize.guard import Guard, GuardResult, default_guards, evaluate
from usg.quantize.methods import QuantSettings, model_size_mb, quantize_model
from usg.quantize.ranking import rank_nodes, rank_op_types

__all__ = [
    "ModelOutcome",
    "QuantizeConfig",
    "QuantizeResult",
    "measure_speed",
    "quantize_graph",
    "run_outputs",
    "split_samples",
]

Log = Callable[[str], None]


@dataclass(frozen=True)
class QuantizeConfig:
    models: tuple[str, ...] = ()  # empty: every ONNX model of the graph
    settings: QuantSettings = field(default_factory=QuantSettings)
    per_model: Mapping[str, QuantSettings] = field(default_factory=dict)  # overrides ``settings``
    guards: tuple[Guard, ...] = ()  # empty: one default per output type
    holdout: float = 0.25
    fallback: str = "nodes"  # or "op-types"
    max_trials: int = 12
    max_calibration_items: int = 64


@dataclass
class ModelOutcome:
    """One model's result: the file chosen (None: stays FP32), what stayed FP32, and why."""

    name: str
    source: Path
    settings: QuantSettings
    path: Path | None = None
    sensitivity: GuardResult | None = None  # this model alone, as first quantized
    final: GuardResult | None = None  # this model alone, with its exclusions
    calibration_items: int = 0
    trials: list[dict[str, Any]] = field(default_factory=list)
    status: str = "quantized"  # quantized | fp32 (fallback exhausted)
    ranked: list[str] = field(default_factory=list)  # most harmful first (for the "stay FP32" table)
    size_mb: dict[str, float] = field(default_factory=dict)
    speed: dict[str, Any] = field(default_factory=dict)

    @property
    def quantized(self) -> bool:
        return self.path is not None


@dataclass
class QuantizeResult:
    graph: Graph
    guards: tuple[Guard, ...]
    outcomes: dict[str, ModelOutcome]
    combined: GuardResult | None
    calibration_samples: int
    holdout_samples: int
    trials: int
    items: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    @property
    def holds(self) -> bool:
        return self.combined is not None and self.combined.holds

    def quantized_graph(self) -> Graph:
        models = dict(self.graph.models)
        for name, o in self.outcomes.items():
            if o.path is not None:
                models[name] = dataclasses.replace(models[name], path=o.path)
        return dataclasses.replace(self.graph, models=models)


def split_samples(samples: Sequence[Sample], holdout: float) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held out): every k-th sample is held out, at least one of each."""
    if len(samples) < 2:
        raise UsageError(
            f"--inputs gave {len(samples)} sample(s); quantizing needs at least 2 (calibration and a "
            "held-out one for the guard); fix: add images / text lines to the --inputs folder"
        )
    if not 0 < holdout < 1:
        raise UsageError(f"--holdout {holdout}: must be between 0 and 1; fix: e.g. --holdout 0.25")
    n_hold = min(len(samples) - 1, max(1, round(len(samples) * holdout)))
    step = len(samples) / n_hold
    held = {int(i * step + step / 2) for i in range(n_hold)}
    return [s for i, s in enumerate(samples) if i not in held], [s for i, s in enumerate(samples) if i in held]


class _KeepOpen(DelegatingBackend):
    """A loaded backend shared by the evaluations of one run: ``close`` is left to its owner."""

    def load(self) -> None:
        if self.inner.state is not BackendState.LOADED:
            self.inner.load()
        self.state = self.inner.state

    def close(self) -> None:
        pass


def run_outputs(
    graph: Graph, samples: Sequence[Sample], backends: Mapping[str, Backend] | None = None
) -> list[dict[str, Any]]:
    """The graph's outputs per sample (no batching, so FP32 and quantized runs are comparable);
    ``backends`` are already-loaded ones to reuse (they are not closed)."""
    from usg.runtime import Executor

    shared = {n: _KeepOpen(b) for n, b in (backends or {}).items()}

    async def go() -> list[dict[str, Any]]:
        async with Executor(graph, batching=False, backends=shared) as ex:
            return [dict((await ex.infer(s.inputs())).outputs) for s in samples]

    return asyncio.run(go())


def _selected(graph: Graph, names: Sequence[str]) -> list[str]:
    onnx_models = [n for n, m in graph.models.items() if m.backend == "onnxruntime" and m.path is not None]
    if not names:
        return onnx_models
    bad = [n for n in names if n not in onnx_models]
    if bad:
        raise UsageError(
            f"--models {','.join(bad)}: not an ONNX model of graph {graph.name!r}; "
            f"fix: use some of {', '.join(onnx_models)}"
        )
    return list(names)


def _thin(items: Sequence[Any], n: int) -> list[Any]:
    if len(items) <= n:
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


class _Search:
    """The fallback search for the models of one run (re-quantize, swap in, evaluate)."""

    def __init__(
        self,
        graph: Graph,
        holdout: Sequence[Sample],
        reference: list[dict[str, Any]],
        guards: list[Guard],
        items: Mapping[str, Sequence[Mapping[str, Any]]],
        work: Path,
        config: QuantizeConfig,
        log: Log,
    ) -> None:
        self.graph, self.holdout, self.reference, self.guards = graph, holdout, reference, guards
        self.items, self.work, self.config, self.log = items, work, config, log
        self.trials = 0
        self.fp32: dict[str, Backend] = {}  # loaded once, shared by every evaluation

    def shared(self, files: Mapping[str, Path]) -> dict[str, Backend]:
        """The FP32 backends (created once) of the models not replaced by ``files``."""
        from usg.runtime.runner import backend_for

        for n, m in self.graph.models.items():
            if n not in self.fp32:
                self.fp32[n] = backend_for(m)
        return {n: b for n, b in self.fp32.items() if n not in files}

    def evaluate(self, files: Mapping[str, Path]) -> GuardResult:
        models = {n: dataclasses.replace(m, path=files[n]) if n in files else m for n, m in self.graph.models.items()}
        outputs = run_outputs(dataclasses.replace(self.graph, models=models), self.holdout, self.shared(files))
        return evaluate(self.reference, outputs, self.guards)

    def quantize(self, o: ModelOutcome, settings: QuantSettings) -> Path:
        self.trials += 1
        dst = self.work / f"{o.name}.trial{self.trials}.onnx"
        quantize_model(o.source, dst, settings, self.items.get(o.name, ()))
        return dst

    def steps(self, o: ModelOutcome) -> list[QuantSettings]:
        """The exclusion steps to try for ``o`` beyond what it already keeps in FP32, mildest first:
        the 1, 2, 4, … most harmful nodes (or op types), never all of them (that is the FP32 model)."""
        s = o.settings
        ranked = rank_nodes(o.source, s, self.items.get(o.name, ()))
        o.ranked = [h.node for h in ranked]
        if not ranked:
            return []
        if self.config.fallback == "op-types":
            types = [t for t, _ in rank_op_types(ranked)]
            return [
                dataclasses.replace(s, exclude_op_types=(*s.exclude_op_types, *types[: i + 1]))
                for i in range(len(types) - 1)
            ]
        out, k = [], max(1, len(s.exclude_nodes))
        while k < len(ranked):
            out.append(dataclasses.replace(s, exclude_nodes=(*s.exclude_nodes, *(h.node for h in ranked[:k]))))
            k *= 2
        return out


def _fix_alone(search: _Search, o: ModelOutcome, first: Path) -> None:
    """Tighten ``o`` (quantized alone) until its guard holds, or give up and keep it FP32."""
    result = o.sensitivity
    assert result is not None
    path: Path | None = first
    if not result.holds:
        path = None
        for settings in search.steps(o):
            if search.trials >= search.config.max_trials:
                break
            candidate = search.quantize(o, settings)
            result = search.evaluate({o.name: candidate})
            o.trials.append({"settings": settings.to_json(), "guard": result.to_json()})
            search.log(f"{o.name}: {_excluded_text(settings)} FP32 → {_metrics_text(result)}")
            if result.holds:
                o.settings, path = settings, candidate
                break
        if path is None:
            o.status = "fp32"
    o.path, o.final = path, result


def quantize_graph(
    graph: Graph, samples: Sequence[Sample], config: QuantizeConfig, out_dir: Path, *, log: Log | None = None
) -> QuantizeResult:
    """Quantize the selected models of ``graph``; the chosen files land in ``out_dir``."""
    from usg.bench.tune import capture_items

    say = log or (lambda _m: None)
    names = _selected(graph, config.models)
    calibration, holdout = split_samples(samples, config.holdout)
    guards = list(config.guards)
    say(f"calibrating on {len(calibration)} sample(s), guarding on {len(holdout)} held out")
    captured, _ = capture_items(graph, calibration)
    items = {n: _thin(captured.get(n, []), config.max_calibration_items) for n in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: dict[str, ModelOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="usg-quant-", dir=out_dir) as tmp:
        search = _Search(graph, holdout, [], guards, items, Path(tmp), config, say)
        try:
            search.reference = run_outputs(graph, holdout, search.shared({}))
            if not guards:
                search.guards = guards = default_guards(search.reference)
            evaluate(search.reference, search.reference, guards)  # validates the guards against the outputs
            say("guards: " + ", ".join(str(g) for g in guards))
            for name in names:
                source = graph.models[name].path
                assert source is not None
                o = ModelOutcome(
                    name, source, config.per_model.get(name, config.settings), calibration_items=len(items[name])
                )
                first = search.quantize(o, o.settings)
                o.sensitivity = search.evaluate({name: first})
                say(f"{name} alone ({o.settings.method}): {_metrics_text(o.sensitivity)}")
                _fix_alone(search, o, first)
                outcomes[name] = o
            combined = _fix_combined(search, outcomes)
        finally:
            for b in search.fp32.values():
                b.close()
        # a run whose guard does not hold names its files apart: NAME.METHOD.onnx may be what the sidecar
        # of an earlier run (that held) points at, and usg run/serve would load the replacement silently
        held = combined is not None and combined.holds
        for o in outcomes.values():
            o.size_mb = {"fp32": round(model_size_mb(o.source), 3)}
            if o.path is not None:
                final = out_dir / f"{o.name}.{o.settings.method}{'' if held else '.unguarded'}.onnx"
                partial = Path(tmp) / f"{final.name}.partial"
                shutil.copyfile(o.path, partial)
                os.replace(partial, final)  # whole or not at all (Ctrl-C, a full disk)
                o.path = final
                o.size_mb["quantized"] = round(model_size_mb(final), 3)
    return QuantizeResult(
        graph, tuple(guards), outcomes, combined, len(calibration), len(holdout), search.trials, items
    )


def measure_speed(result: QuantizeResult, *, seconds: float = 1.0, rounds: int = 2, log: Log | None = None) -> None:
    """Items/s of each quantized model at its batch size and threads, FP32 vs quantized in the same
    run (alternating, ``rounds`` times; the best round of each counts, the least disturbed by
    other work on a shared machine), timed alone on the recorded calibration items."""
    from usg.bench.tune import profile_model

    for name, o in result.outcomes.items():
        items = result.items.get(name) or []
        if o.path is None or not items:
            continue
        model = result.graph.models[name]
        batch = max(1, model.batch.max_size)
        threads = int(model.options.get("intra_op_threads") or 1)
        best: dict[str, float] = {}
        for _ in range(rounds):
            for label, path in (("fp32", o.source), ("quantized", o.path)):
                m = dataclasses.replace(model, path=path)
                points = profile_model(m, items, batch_sizes=(batch,), threads=(threads,), seconds_per_point=seconds)
                if points:
                    best[label] = max(best.get(label, 0.0), points[0].items_per_s)
        o.speed = {"batch": batch, "threads": threads, **{k: round(v, 2) for k, v in best.items()}}
        if "fp32" in best and "quantized" in best:
            o.speed["speedup"] = round(best["quantized"] / best["fp32"], 3)
        if log is not None:
            log(f"{name}: batch {batch}, {threads} thread(s): {o.speed}")


def _fix_combined(search: _Search, outcomes: dict[str, ModelOutcome]) -> GuardResult | None:
    """All quantized models together; tighten the one with the least margin while the guard fails."""
    live = {n: o for n, o in outcomes.items() if o.path is not None}
    if not live:
        return None
    combined = search.evaluate({n: o.path for n, o in live.items() if o.path is not None})
    search.log(f"all together: {_metrics_text(combined)}")
    pending = {n: None for n in live}  # models that may still be tightened
    while not combined.holds and pending and search.trials < search.config.max_trials:
        name = min(pending, key=lambda n: _margin(live[n].final))
        o = live[name]
        assert o.path is not None
        steps = search.steps(o)
        if not steps:
            o.path, o.status = None, "fp32"
            pending.pop(name)
        else:
            settings = steps[0]
            o.path, o.settings = search.quantize(o, settings), settings
        files = {n: p.path for n, p in live.items() if p.path is not None}
        combined = search.evaluate(files)
        o.trials.append({"settings": o.settings.to_json(), "together": True, "guard": combined.to_json()})
        search.log(f"all together, {name} {_excluded_text(o.settings)} FP32: {_metrics_text(combined)}")
    return combined


def _margin(r: GuardResult | None) -> float:
    """How comfortably a result clears its guards (the smallest signed distance to a threshold)."""
    if r is None:
        return float("inf")
    return min(((r.value(g) - g.threshold) if g.op == ">=" else (g.threshold - r.value(g))) for g in r.guards)


def _excluded_text(s: QuantSettings) -> str:
    if s.exclude_op_types:
        return f"op types {', '.join(s.exclude_op_types)}"
    return f"{len(s.exclude_nodes)} node(s)"


def _metrics_text(r: GuardResult) -> str:
    parts = [f"{g} = {r.value(g):.4f}{'' if g.holds(r.value(g)) else ' ✗'}" for g in r.guards]
    return "; ".join(parts)
