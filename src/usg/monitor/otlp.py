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


def _value(v: Any) -> Any:
    if not isinstance(v, Mapping):
        return None
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v and isinstance(v["arrayValue"], Mapping):
        values = v["arrayValue"].get("values", [])
        return [_value(x) for x in values] if isinstance(values, list) else None
    return None


def _attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    attrs = span.get("attributes", [])
    if not isinstance(attrs, list):
        raise ValueError(f"attributes is a {type(attrs).__name__}, not a list")
    return {str(a["key"]): _value(a.get("value", {})) for a in attrs if isinstance(a, Mapping) and "key" in a}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _spans(doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):  # a list of traces
        for item in doc["data"]:
            yield from _spans(item)
        return
    if not isinstance(doc, dict):
        return
    for rs in _list(doc.get("resourceSpans", doc.get("batches", []))):
        if not isinstance(rs, dict):
            continue
        for ss in _list(rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", []))):
            if isinstance(ss, dict):
                yield from _list(ss.get("spans", []))


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"trace file {path} cannot be read ({exc}); fix: pass an OTLP/JSON file") from None
    try:
        yield json.loads(text)
        return
    except RecursionError:
        raise UsageError(f"{path}: JSON nested too deep to be a trace; fix: pass OTLP/JSON") from None
    except ValueError:
        pass
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except (ValueError, RecursionError) as exc:
            why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            raise UsageError(
                f"{path}:{i}: not JSON ({why}); fix: pass OTLP/JSON (one document, or one per line)"
            ) from None


def _node(span: Mapping[str, Any], start: int) -> NodeSpan:
    a = _attrs(span)
    s0, s1 = int(span.get("startTimeUnixNano", start)), int(span.get("endTimeUnixNano", start))
    up = a.get("usg.upstream")
    return NodeSpan(
        str(a.get("usg.node", str(span["name"])[5:])),
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


#: what a span that cannot be read raises (a field of the wrong type or form); such a span is skipped
_SPAN_ERRORS = (AttributeError, KeyError, TypeError, ValueError, OverflowError)


#: what a span id may be in JSON (None: absent); a list or an object cannot be looked up
_ID_TYPES = (str, int, float, type(None))


def _build(trace_id: str, spans: list[dict[str, Any]], skipped: list[str]) -> list[RequestTrace]:
    children: dict[Any, list[dict[str, Any]]] = {}  # parent span id -> its node spans (one pass, not one per root)
    for s in spans:
        if str(s.get("name", "")).startswith("node "):
            parent = s.get("parentSpanId")
            if not isinstance(parent, _ID_TYPES):  # a list or an object: not a key, and no span's id
                skipped.append(f"node span {s.get('spanId')!r}: parentSpanId is a {type(parent).__name__}, not an id")
                continue
            children.setdefault(parent, []).append(s)
    out = []
    for root in (s for s in spans if s.get("name") == "usg.request"):
        if not isinstance(root.get("spanId"), _ID_TYPES):
            skipped.append(
                f"request span {root.get('spanId')!r}: spanId is a {type(root.get('spanId')).__name__}, not an id"
            )
            continue
        try:
            attrs = _attrs(root)
            start = int(root.get("startTimeUnixNano", 0))
            req = RequestTrace(
                trace_id,
                str(attrs.get("usg.request_id", root.get("spanId", ""))),
                (int(root.get("endTimeUnixNano", start)) - start) / 1e6,
                str(attrs.get("usg.status", "ok")),
                start,
            )
        except _SPAN_ERRORS as exc:
            skipped.append(f"request span {root.get('spanId')!r}: {type(exc).__name__}: {exc}")
            continue
        for s in children.get(root.get("spanId"), []) if root.get("spanId") is not None else []:
            try:
                req.nodes.append(_node(s, start))
            except _SPAN_ERRORS as exc:
                skipped.append(f"node span {s.get('spanId')!r}: {type(exc).__name__}: {exc}")
        out.append(req)
    return out


def read_traces(paths: list[Path], skipped: list[str] | None = None) -> list[RequestTrace]:
    """Every ``usg.request`` span of the files with its node spans (grouped by trace id). A span
    whose fields cannot be read (a time that is not a number, attributes that are not a list) is
    left out and described in ``skipped``; a file that is not JSON is a :class:`UsageError`."""
    skipped = [] if skipped is None else skipped
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for doc in _documents(path):
            for span in _spans(doc):
                if isinstance(span, dict):
                    by_trace.setdefault(str(span.get("traceId", "")), []).append(span)
    requests = [r for tid, spans in by_trace.items() for r in _build(tid, spans, skipped)]
    if not requests:
        bad = f" ({len(skipped)} could not be read, e.g. {skipped[0]})" if skipped else ""
        raise UsageError(
            f"no usg.request spans in {', '.join(map(str, paths))}{bad}; fix: record them with "
            "`usg serve --trace-file PATH` (or --otel otlp into Jaeger/Tempo and export the traces as OTLP JSON)"
        )
    return sorted(requests, key=lambda r: r.start_ns)
