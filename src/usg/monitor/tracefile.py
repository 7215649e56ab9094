"""``usg serve --trace-file PATH``: USG's own spans as OTLP/JSON lines, no collector needed.

Each finished request appends one line, an OTLP ``ExportTraceServiceRequest`` in its JSON form
(``{"resourceSpans": [{"resource": …, "scopeSpans": [{"spans": [...]}]}]}``): the ``usg.request``
span, one ``node NAME`` span per node run, and for model nodes ``queue`` and ``compute`` children —
the span names and ``usg.*`` attributes of ``--otel`` (see ``usg.serve.tracing``), plus
``usg.batch_wait_ms``: the part of the queue wait spent in the batch window (at most the model's
``max_delay_ms`` per item; the rest waited for a free instance). A writer thread does the I/O.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from usg.errors import UsageError
from usg.graph.model import Graph
from usg.monitor.addon import ServeAddon
from usg.runtime.observer import NodeEvent

__all__ = ["TraceFileWriter", "otlp_attributes"]

_SERVER, _INTERNAL = 2, 1


def _attr_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_attr_value(v) for v in value]}}
    return {"stringValue": str(value)}


def otlp_attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _attr_value(v)} for k, v in attrs.items()]


class TraceFileWriter(ServeAddon):
    """Writes one OTLP/JSON line per finished request to ``path`` (appending)."""

    def __init__(self, path: str | Path, graph: Graph, *, batching: bool = True) -> None:
        self.path = Path(path)
        try:
            self._fh = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"--trace-file {self.path}: cannot open for writing ({exc}); fix: pass a writable path"
            ) from None
        self.graph = graph
        self.batching = batching
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._nodes: dict[str, list[NodeEvent]] = {}
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="usg-trace-file", daemon=True)
        self._thread.start()
        self.written = 0

    def _ns(self, perf: float) -> int:
        return int(perf * 1e9) + self._offset_ns

    def request_started(self, request_id: str, modalities: Sequence[str]) -> None:
        self._nodes[request_id] = []

    def node_finished(self, event: NodeEvent) -> None:
        events = self._nodes.get(event.request_id)
        if events is not None:
            events.append(event)

    def request_finished(
        self, request_id: str, modalities: Sequence[str], seconds: float, status: str, pruned: Sequence[str]
    ) -> None:
        events = self._nodes.pop(request_id, [])
        end = time.perf_counter()
        self._lines.put(self._line(request_id, modalities, end - seconds, end, status, pruned, events))

    def _batch_wait_ms(self, event: NodeEvent) -> float:
        model = self.graph.models.get(event.model or "")
        if model is None or not (self.batching and model.batch.enabled):
            return 0.0
        return min(event.queue_ms, model.batch.max_delay_ms * max(1, event.items))

    def _span(
        self, trace: str, name: str, parent: str | None, start: int, end: int, attrs: dict[str, Any], ok: bool = True
    ) -> tuple[str, dict[str, Any]]:
        sid = os.urandom(8).hex()
        span: dict[str, Any] = {
            "traceId": trace,
            "spanId": sid,
            "name": name,
            "kind": _SERVER if parent is None else _INTERNAL,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(max(start, end)),
            "attributes": otlp_attributes(attrs),
            "status": {} if ok else {"code": 2},
        }
        if parent is not None:
            span["parentSpanId"] = parent
        return sid, span

    def _line(
        self,
        rid: str,
        modalities: Sequence[str],
        start: float,
        end: float,
        status: str,
        pruned: Sequence[str],
        events: list[NodeEvent],
    ) -> str:
        trace = os.urandom(16).hex()
        attrs: dict[str, Any] = {
            "usg.request_id": rid,
            "usg.modalities": "+".join(sorted(modalities)),
            "usg.status": status,
            "usg.graph": self.graph.name,
        }
        if pruned:
            attrs["usg.pruned_nodes"] = list(pruned)
        root, root_span = self._span(trace, "usg.request", None, self._ns(start), self._ns(end), attrs, status == "ok")
        spans = [root_span]
        for ev in events:
            s, e = self._ns(ev.start), self._ns(ev.end)
            nattrs: dict[str, Any] = {"usg.node": ev.node, "usg.kind": ev.kind, "usg.items": ev.items}
            if ev.node in self.graph.nodes:
                nattrs["usg.upstream"] = sorted(self.graph.upstream(ev.node))
            if ev.model is not None:
                nattrs.update(
                    {
                        "usg.model": ev.model,
                        "usg.queue_ms": round(ev.queue_ms, 3),
                        "usg.batch_wait_ms": round(self._batch_wait_ms(ev), 3),
                        "usg.compute_ms": round(ev.compute_ms, 3),
                    }
                )
            nid, nspan = self._span(trace, f"node {ev.node}", root, s, e, nattrs, ev.ok)
            spans.append(nspan)
            if ev.model is not None:
                q_end = min(e, s + int(ev.queue_ms * 1e6))
                c_end = min(e, q_end + int(ev.compute_ms * 1e6))
                spans.append(self._span(trace, "queue", nid, s, q_end, {"usg.model": ev.model})[1])
                spans.append(self._span(trace, "compute", nid, q_end, c_end, {"usg.model": ev.model})[1])
        doc = {
            "resourceSpans": [
                {
                    "resource": {"attributes": otlp_attributes({"service.name": f"usg:{self.graph.name}"})},
                    "scopeSpans": [{"scope": {"name": "usg.monitor.tracefile"}, "spans": spans}],
                }
            ]
        }
        return json.dumps(doc, separators=(",", ":"))

    def _write(self) -> None:
        while True:
            line = self._lines.get()
            if line is None:
                break
            self._fh.write(line + "\n")
            self.written += 1
            if self._lines.empty():
                self._fh.flush()

    def close(self) -> None:
        self._lines.put(None)
        self._thread.join(timeout=10)
        self._fh.close()
