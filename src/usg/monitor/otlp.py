"""Read OTLP/JSON traces into per-request views: USG's ``--trace-file`` lines, or a trace exported
from Jaeger (``{"result": {"resourceSpans": …}}``) or Tempo (``resourceSpans`` or the older
``batches``), one JSON document per file or one per line. Ids may be hex or base64 (used as-is)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.errors import UsageError

__all__ = ["NodeSpan", "RequestTrace", "read_traces"]


@dataclass
class NodeSpan:
    node: str
    start_ms: float  # from the request's start
    end_ms: float
    kind: str = "fn"
    model: str | None = None
    queue_ms: float = 0.0
    batch_wait_ms: float = 0.0
    compute_ms: float = 0.0
    items: int = 1
    upstream: tuple[str, ...] | None = None  # graph upstream nodes, when the span says (USG's trace file)

    @property
    def wall_ms(self) -> float:
        return max(0.0, self.end_ms - self.start_ms)


@dataclass
class RequestTrace:
    trace_id: str
    request_id: str
    latency_ms: float
    status: str
    start_ns: int
    nodes: list[NodeSpan] = field(default_factory=list)


def _value(v: Mapping[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in span.get("attributes", []) if "key" in a}


def _spans(doc: Any) -> Iterator[dict[str, Any]]:
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):  # a list of traces
        for item in doc["data"]:
            yield from _spans(item)
        return
    if not isinstance(doc, dict):
        return
    for rs in doc.get("resourceSpans", doc.get("batches", [])) or []:
        for ss in rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", [])) or []:
            yield from ss.get("spans", []) or []


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"trace file {path} cannot be read ({exc}); fix: pass an OTLP/JSON file") from None
    try:
        yield json.loads(text)
        return
    except json.JSONDecodeError:
        pass
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{path}:{i}: not JSON ({exc}); fix: pass OTLP/JSON (one document, or one per line)"
            ) from None


def _build(trace_id: str, spans: list[dict[str, Any]]) -> list[RequestTrace]:
    out = []
    for root in (s for s in spans if s.get("name") == "usg.request"):
        attrs = _attrs(root)
        start = int(root.get("startTimeUnixNano", 0))
        req = RequestTrace(
            trace_id,
            str(attrs.get("usg.request_id", root.get("spanId", ""))),
            (int(root.get("endTimeUnixNano", start)) - start) / 1e6,
            str(attrs.get("usg.status", "ok")),
            start,
        )
        for s in spans:
            if s.get("parentSpanId") != root.get("spanId") or not str(s.get("name", "")).startswith("node "):
                continue
            a = _attrs(s)
            s0, s1 = int(s.get("startTimeUnixNano", start)), int(s.get("endTimeUnixNano", start))
            up = a.get("usg.upstream")
            req.nodes.append(
                NodeSpan(
                    str(a.get("usg.node", str(s["name"])[5:])),
                    (s0 - start) / 1e6,
                    (s1 - start) / 1e6,
                    str(a.get("usg.kind", "fn")),
                    a.get("usg.model"),
                    float(a.get("usg.queue_ms", 0.0) or 0.0),
                    float(a.get("usg.batch_wait_ms", 0.0) or 0.0),
                    float(a.get("usg.compute_ms", 0.0) or 0.0),
                    int(a.get("usg.items", 1) or 1),
                    tuple(str(u) for u in up) if isinstance(up, list) else None,
                )
            )
        out.append(req)
    return out


def read_traces(paths: list[Path]) -> list[RequestTrace]:
    """Every ``usg.request`` span of the files with its node spans (grouped by trace id)."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for doc in _documents(path):
            for span in _spans(doc):
                by_trace.setdefault(str(span.get("traceId", "")), []).append(span)
    requests = [r for tid, spans in by_trace.items() for r in _build(tid, spans)]
    if not requests:
        raise UsageError(
            f"no usg.request spans in {', '.join(map(str, paths))}; fix: record them with "
            "`usg serve --trace-file PATH` (or --otel otlp into Jaeger/Tempo and export the traces as OTLP JSON)"
        )
    return sorted(requests, key=lambda r: r.start_ns)
