"""Live drift and health in ``usg serve --reference``: an executor observer plus one worker thread.

On the event loop the hooks only append references to bounded deques (a request's decoded inputs,
its watched outputs, its latency and status). The worker thread turns them into features, keeps the
sliding window (last ``size`` requests or last ``seconds``), samples queue saturation and the
rejection counter, and every ``step`` requests (or seconds) compares the window with the reference
profile (:func:`usg.monitor.drift.compare_profiles`). When the worker falls behind, observations are
dropped and counted (``dropped``), never queued without bound.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from usg.graph.model import Graph
from usg.monitor.addon import ServeAddon
from usg.monitor.config import MonitorConfig, monitor_config
from usg.monitor.drift import compare_profiles, require_scipy
from usg.monitor.features import sniff_format
from usg.monitor.health import RequestRecord, health_score
from usg.monitor.sketch import Observation, summarize
from usg.monitor.tap import Tap
from usg.records import CacheEvent
from usg.specs import Modality

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from usg.serve.app import ServeContext

__all__ = ["LiveMonitor"]

log = logging.getLogger("usg.monitor")
_PENDING_MAX = 256
_PENDING_BYTES = 256 * 2**20  # decoded arrays held for the worker (a 40 MP image is 120 MB)
_HISTORY = 20
_TICK_S = 0.25
_TIME_WINDOW_CAP = 20_000
_CACHE_LOOKUPS = 20_000  # node-cache lookups kept for the hit ratio of the health window


def _with_arrays(doc: Any) -> Any:
    """A copy of a profile with its samples and centroids as numpy arrays (converted once, not per window)."""
    if isinstance(doc, dict):
        return {
            k: np.asarray(v, dtype=np.float64)
            if k in ("sample", "centroid") and isinstance(v, list)
            else _with_arrays(v)
            for k, v in doc.items()
        }
    return doc


class LiveMonitor(ServeAddon):
    """Drift of the serving window against ``reference`` and the health score, for one executor."""

    def __init__(
        self,
        graph: Graph,
        reference: Mapping[str, Any],
        config: MonitorConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
    ) -> None:
        require_scipy("usg serve --reference (live drift)")
        self.graph = graph
        self.reference = _with_arrays(reference)
        self.config = config or monitor_config(graph)
        self.tap = Tap(graph, self.config)
        self.clock = clock
        self._rng = random.Random(seed)
        win = self.config.window
        cap = win.size if win.size is not None else _TIME_WINDOW_CAP
        self._pending: collections.deque[tuple[float, Mapping[str, Any], dict[str, Any], dict[str, Any]]]
        self._pending = collections.deque()
        self._formats: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._pending_bytes = 0
        self._window: collections.deque[Observation] = collections.deque(maxlen=cap)
        self._requests: collections.deque[RequestRecord] = collections.deque(maxlen=cap)
        self._saturation: collections.deque[tuple[float, float]] = collections.deque(maxlen=cap)
        self._rejections: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)
        self._lock = threading.Lock()  # the window
        self._step = threading.Lock()  # processing and evaluation (worker, or a caller such as a test)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since_eval = 0.0
        self._last_eval_t = clock()
        self.dropped = 0
        self.observed = 0
        self.evaluations = 0
        self.latest: dict[str, Any] | None = None
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self._ctx: ServeContext | None = None
        self._presence = self._reference_presence()
        self.versions: dict[str, Any] = {"checked": False}
        # (time, hit) of node-cache lookups; empty (not applicable) while the graph has no cache
        self._cache_lookups: collections.deque[tuple[float, bool]] = collections.deque(maxlen=_CACHE_LOOKUPS)

    # -- wiring ------------------------------------------------------------------------------
    def bind(self, ctx: ServeContext) -> None:
        """Attach to a started server: its gate, runners and metrics registry; start the worker."""
        from usg.monitor.gauges import MonitorCollector

        self._ctx = ctx
        ctx.metrics.registry.register(MonitorCollector(self))
        self.start()

    def authorize(self, request: Any) -> None:
        """The server's API-key check (``usg serve --api-key-env``), as for /metrics."""
        if self._ctx is not None and hasattr(self._ctx, "authorize"):
            self._ctx.authorize(request)

    def routes(self) -> list[BaseRoute]:
        from usg.monitor.http import monitor_routes

        return list(monitor_routes(self))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="usg-monitor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- observer hooks (event loop: references only) ----------------------------------------
    def note_raw(self, request_id: str, raw: Mapping[str, Any]) -> None:
        """The encoded request (before decoding): remembers image containers by magic bytes."""
        fmts = {
            n: {"format": sniff_format(bytes(v[:16]))}
            for n, v in raw.items()
            if isinstance(v, (bytes, bytearray))
            and n in self.tap.modalities
            and self.tap.modalities[n] is Modality.IMAGE
        }
        if fmts:
            self._formats[request_id] = fmts
            while len(self._formats) > _PENDING_MAX:  # requests refused before running never pop theirs
                self._formats.popitem(last=False)

    def request_values(
        self, request_id: str, inputs: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any] | None]
    ) -> None:
        meta = self._formats.pop(request_id, {})
        if self.config.sample < 1.0 and self._rng.random() >= self.config.sample:
            return
        size = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
        if len(self._pending) >= _PENDING_MAX or self._pending_bytes + size > _PENDING_BYTES:
            self.dropped += 1
            return
        self._pending_bytes += size
        self._pending.append((self.clock(), inputs, self.tap.pick_outputs(inputs, nodes), meta))
        if len(self._pending) >= 16:
            self._wake.set()

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        self._formats.pop(request_id, None)
        self._requests.append(RequestRecord(self.clock(), seconds, status, tuple(modalities)))

    @property
    def pending_bytes(self) -> int:
        """Bytes of decoded arrays queued for the worker (bounded by 256 MiB)."""
        return self._pending_bytes

    # -- worker ------------------------------------------------------------------------------
    def _work(self) -> None:
        last_rej = 0.0
        self._check_versions()
        while not self._stop.is_set():
            self._wake.wait(_TICK_S)
            self._wake.clear()
            try:
                self.process_pending()
                self._sample_saturation()
                now = self.clock()
                if now - last_rej >= 1.0:
                    self._sample_rejections(now)
                    last_rej = now
                timed = self.config.window.seconds is not None
                if timed and self._window and now - self._last_eval_t >= self.config.window.every:
                    self.evaluate()
            except Exception:  # never let a monitoring bug take the server down; say it once per tick
                log.exception("drift monitor step failed")

    def _check_versions(self) -> None:
        """Compare the served graph's and models' SHA-256 with the reference's (once, off the event loop)."""
        from usg.monitor.profile import graph_digests

        try:
            served = graph_digests(self.graph)
        except OSError as exc:
            self.versions = {"checked": False, "error": str(exc)}
            return
        ref = self.reference.get("graph", {})
        changed = sorted(
            name
            for name, entry in served["models"].items()
            if entry.get("sha256") != ref.get("models", {}).get(name, {}).get("sha256")
        )
        self.versions = {
            "checked": True,
            "graph_changed": served["sha256"] != ref.get("sha256"),
            "models_changed": changed,
        }
        if changed:
            log.warning("the reference profile was built with other model files: %s", ", ".join(changed))

    def process_pending(self) -> int:
        """Turn queued request values into features, evaluating count windows as they fill (worker thread)."""
        n = 0
        with self._step:
            n = self._drain()
        return n

    def _drain(self) -> int:
        """Queue → window; a count window is evaluated exactly every ``step`` observations."""
        n = 0
        counted = self.config.window.seconds is None
        while self._pending:
            t, values, outputs, meta = self._pending.popleft()
            self._pending_bytes -= sum(v.nbytes for v in values.values() if isinstance(v, np.ndarray))
            obs = self.tap.observe(t, values, outputs, meta)
            with self._lock:
                self._window.append(obs)
            n += 1
            self.observed += 1
            self._since_eval += 1
            if counted and self._since_eval >= self.config.window.every:
                self._evaluate()
        return n

    def _sample_saturation(self) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        values = [ctx.gate.inflight / max(1, ctx.config.max_inflight)]
        for name, runner in ctx.executor.runners.items():
            depth = getattr(runner, "queue_depth", None)
            if depth is not None:
                values.append(depth / max(1, self.graph.models[name].batch.max_queue))
        self._saturation.append((self.clock(), max(values)))

    def _rejected_total(self) -> float:
        """The server's rejections so far (its counter's own samples, not the registry: no lock, no recursion)."""
        ctx = self._ctx
        if ctx is None:
            return 0.0
        # a timeout is a failed request (error_rate already counts it), not a refusal
        return sum(
            s.value
            for fam in ctx.metrics.rejected.collect()
            for s in fam.samples
            if s.name.endswith("_total") and s.labels.get("reason") != "timeout"
        )

    def _sample_rejections(self, now: float) -> None:
        self._rejections.append((now, self._rejected_total()))

    # -- results -----------------------------------------------------------------------------
    def window_profile(self, *, raw: bool = False) -> dict[str, Any]:
        """The current window summarised like a profile (``GET /v1/monitor/window``, ``usg drift``);
        ``raw`` keeps the samples as arrays (for the evaluation, no JSON round trip)."""
        from usg.monitor.profile import PROFILE_FORMAT

        now = self.clock()
        with self._lock:
            obs = [
                o for o in self._window if self.config.window.seconds is None or now - o.t <= self.config.window.seconds
            ]
        body = summarize(obs, self.tap.input_modalities, self.config.outputs, cap=self.config.reference_size, raw=raw)
        return {"format": PROFILE_FORMAT, "graph": self.reference.get("graph", {}), "window": True, **body}

    def evaluate(self) -> dict[str, Any]:
        """Compare the current window with the reference now; keeps the result as ``latest``."""
        with self._step:
            return self._evaluate()

    def _evaluate(self) -> dict[str, Any]:
        window = self.window_profile(raw=True)
        result = compare_profiles(self.reference, window, self.config.thresholds)
        result["evaluated_at"] = time.time()
        result["window"] = self.config.window.describe()
        self._since_eval = 0
        self._last_eval_t = self.clock()
        self.evaluations += 1
        self.latest = result
        self.history.append(
            {"evaluated_at": result["evaluated_at"], "drift": result["drift"], "drifted": result["drifted"]}
        )
        if result["drift"]:
            log.warning("drift in window %d: %s", self.evaluations, ", ".join(result["drifted"]))
        return result

    def _reference_presence(self) -> dict[str, float]:
        presence: dict[str, float] = {}
        for name, share in self.reference.get("presence", {}).items():
            d = self.graph.inputs.get(name)
            if d is not None:
                m = d.modality.value
                presence[m] = max(presence.get(m, 0.0), float(share))
        return presence

    def cache_event(self, event: CacheEvent) -> None:
        """A node-cache lookup counts toward the health score's hit ratio (hit or coalesced / lookups)."""
        if event.outcome in ("hit", "coalesced", "miss"):
            self._cache_lookups.append((self.clock(), event.outcome != "miss"))

    def _cache_ratio(self, start: float) -> tuple[int, int] | None:
        if not self._cache_lookups:
            return None
        window = [hit for t, hit in self._cache_lookups if t >= start]
        return sum(window), len(window)

    def health(self) -> dict[str, Any]:
        now = self.clock()
        win = self.config.window
        requests = [r for r in self._requests if win.seconds is None or now - r.t <= win.seconds]
        start = requests[0].t if requests else now
        rej = list(self._rejections)
        before = [v for t, v in rej if t <= start]
        base = before[-1] if before else (rej[0][1] if rej else 0.0)
        rejected = int(max(0.0, self._rejected_total() - base)) if self._ctx is not None else 0
        sat = [v for t, v in self._saturation if t >= start]
        return health_score(
            requests,
            weights=self.config.weights,
            declared_modalities=sorted({d.modality.value for d in self.graph.inputs.values()}),
            reference_presence=self._presence,
            rejected=rejected,
            saturation=sat,
            cache=self._cache_ratio(start),
        )

    def snapshot(self) -> dict[str, Any]:
        """What ``GET /v1/monitor`` returns."""
        ref_graph = self.reference.get("graph", {})
        return {
            "reference": {
                "graph": ref_graph.get("name"),
                "graph_sha256": ref_graph.get("sha256"),
                "models": {k: v.get("sha256") for k, v in ref_graph.get("models", {}).items()},
                "count": self.reference.get("count"),
                "versions": self.versions,
            },
            "window": {
                "spec": self.config.window.describe(),
                "observations": len(self._window),
                "observed_total": self.observed,
                "dropped": self.dropped,
                "evaluations": self.evaluations,
            },
            "drift": self.latest,
            "history": list(self.history),
            "health": self.health(),
        }
