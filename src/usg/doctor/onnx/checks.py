"""ONNX checks, part 1: can the model be loaded, checked and run by the runtime at all?

The subject is an :class:`OnnxSubject`, loaded once per file (without external
data, which is only located, never read). Semantic checks (batch dims, Resize,
fp16, int64...) live in :mod:`usg.doctor.onnx.semantics`; versions and the
ONNX Runtime session in :mod:`usg.doctor.onnx.runtime_compat`.

Codes: ONNX001, ONNX002, ONNX005, ONNX014-ONNX020.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from usg.doctor.findings import Finding, Location, RootCause, Severity
from usg.doctor.registry import CodeInfo, check, finding
from usg.doctor.runner import CheckContext

__all__ = ["OnnxSubject", "load_onnx"]

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO

# Domains whose ops the stock ONNX Runtime implements.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training"})

# protobuf cannot serialise a message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31

C_LOAD = CodeInfo(
    "ONNX018",
    E,
    RootCause.CONFIG_INVALID,
    "ONNX file cannot be parsed",
    "The file is not a valid ONNX protobuf (truncated, wrong file, or a Git LFS pointer).",
)
C_TOO_BIG = CodeInfo(
    "ONNX017",
    E,
    RootCause.MEMORY,
    "model of 2 GB or more without external data",
    "Protobuf cannot hold 2 GiB; such models must keep weights in external data files.",
)
C_CHECKER = CodeInfo(
    "ONNX001",
    E,
    RootCause.CONFIG_INVALID,
    "onnx.checker rejects the model",
    "onnx.checker.check_model fails: the graph breaks the ONNX spec (strict shape "
    "inference, the other half of a full check, is ONNX002).",
)
C_SHAPE = CodeInfo(
    "ONNX002",
    E,
    RootCause.SHAPE_OR_RANK,
    "shape inference fails",
    "Strict ONNX shape inference finds incompatible shapes or types between nodes (a warning "
    "when the failure is inside an op's function body and ONNX Runtime loads and runs the model).",
    also_severities=(W,),
)
C_CUSTOM = CodeInfo(
    "ONNX005",
    E,
    RootCause.UNSUPPORTED_OP,
    "op in a custom domain without implementation",
    "A node uses an op domain the stock runtime does not implement; it needs a custom-op "
    "library registered in the session (and a TensorRT plugin).",
)
C_EXT = CodeInfo(
    "ONNX014",
    E,
    RootCause.ENVIRONMENT,
    "external-data file missing",
    "An initializer stores its data in an external file that is not next to the model.",
)
C_UNUSED_INIT = CodeInfo(
    "ONNX015",
    N,
    RootCause.CONFIG_INVALID,
    "unused initializer",
    "An initializer no node reads: dead weight in the file.",
)
C_UNUSED_IN = CodeInfo(
    "ONNX016",
    W,
    RootCause.CONFIG_INVALID,
    "unused graph input",
    "A graph input no node reads; servers still require clients to send it.",
)
C_NO_OUTPUTS = CodeInfo(
    "ONNX019",
    E,
    RootCause.CONFIG_INVALID,
    "graph declares no outputs",
    "A graph without outputs loads but can never be run: ONNX Runtime refuses every request with "
    '"At least one output should be requested".',
)
C_NEGATIVE_DIM = CodeInfo(
    "ONNX020",
    W,
    RootCause.CONFIG_INVALID,
    "negative dimension in a graph input or output",
    "A declared dimension below -1 is no size: ONNX Runtime reads it as dynamic, while tools that read the "
    "file's shapes (server configs, clients) see the number. (-1 is the dynamic-size convention of "
    "Paddle2ONNX and Triton, and is not flagged.)",
)


@dataclass
class OnnxSubject:
    """An ONNX file loaded once for all checks (weights in external files are not read)."""

    path: Path
    size: int
    model: onnx.ModelProto | None = None
    load_error: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def loc(self) -> str:
        return str(self.path)

    def opset(self, domain: str = "") -> int | None:
        assert self.model is not None
        for imp in self.model.opset_import:
            if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
                return int(imp.version)
        return None

    @property
    def checker_error(self) -> str | None:
        """onnx.checker's complaint, or None; computed once."""
        if "checker" not in self._cache:
            self._cache["checker"] = _run_checker(self)
        return self._cache["checker"]

    @property
    def inferred(self) -> onnx.ModelProto | None:
        """The model after (non-strict) shape inference, or None if inference crashed."""
        if "inferred" not in self._cache:
            assert self.model is not None
            try:
                self._cache["inferred"] = onnx.shape_inference.infer_shapes(self.model)
            except Exception:
                self._cache["inferred"] = None
        return self._cache["inferred"]


def load_onnx(path: Path, ctx: CheckContext) -> OnnxSubject:
    """Load ``path`` once per run (cached in ``ctx``), never raising."""
    return ctx.cached(("onnx", path.resolve()), lambda: _load(path))


def _load(path: Path) -> OnnxSubject:
    size = path.stat().st_size
    subject = OnnxSubject(path=path, size=size)
    if size >= PROTOBUF_LIMIT:
        subject.load_error = "too_big"
        return subject
    if size == 0:  # onnx.load reads 0 bytes as an empty model, which the checker then calls a bad ir_version
        subject.load_error = "empty"
        return subject
    try:
        subject.model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        subject.load_error = f"{type(exc).__name__}: {exc}"
    return subject


def _run_checker(subject: OnnxSubject) -> str | None:
    try:
        onnx.checker.check_model(str(subject.path), full_check=False)
    except Exception as exc:
        return str(exc).strip()
    return None


def _f(
    info: CodeInfo,
    subject: OnnxSubject,
    message: str,
    fix: str,
    element: str | None = None,
    severity: Severity | None = None,
    **evidence: Any,
) -> Finding:
    return finding(info, message, Location(subject.loc, element), fix, evidence, severity=severity)


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@check("onnx", codes=[C_LOAD, C_TOO_BIG])
def check_loadable(s: OnnxSubject) -> Iterator[Finding]:
    if s.load_error == "too_big":
        yield _f(
            C_TOO_BIG,
            s,
            f"the file is {s.size / 2**30:.2f} GiB, above protobuf's 2 GiB limit",
            "re-save with onnx.save_model(model, path, save_as_external_data=True, "
            "all_tensors_to_one_file=True, location='model.onnx.data')",
            size_bytes=s.size,
            limit_bytes=PROTOBUF_LIMIT,
        )
    elif s.load_error == "empty":
        yield _f(
            C_LOAD,
            s,
            "the file is empty (0 bytes)",
            "the export or the copy that wrote it did not finish (a full disk, a killed process, an interrupted "
            "download): export or copy the model again",
            size_bytes=0,
        )
    elif s.load_error is not None:
        yield _f(
            C_LOAD,
            s,
            f"onnx.load fails: {_short(s.load_error)}",
            "re-export the model; if it is a few hundred bytes it may be a Git LFS pointer (run git lfs pull)",
            error=_short(s.load_error),
            size_bytes=s.size,
        )


@check("onnx", codes=[C_CHECKER])
def check_checker(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None or s.checker_error is None or _missing_external(s):
        return  # with external data missing the checker only repeats ONNX014
    first = s.checker_error.splitlines()[0]
    yield _f(
        C_CHECKER,
        s,
        f"onnx.checker rejects the model: {_short(first, 300)}",
        "fix the exporter call or the graph surgery that produced this node; run "
        "onnx.checker.check_model(path, full_check=True) to reproduce",
        error=_short(s.checker_error),
    )


_SHAPE_NODE_RE = re.compile(r"\(op_type:(\w+), node name: ([^)]*)\)")


_FUNCTION_BODY_RE = re.compile(r"\(op_type:(\w+)[^)]*\):\s*\[ShapeInferenceError\] Inference error\(s\):\s*\(op_type:")


@check("onnx", codes=[C_SHAPE])
def check_shape_inference(s: OnnxSubject) -> Iterator[Finding]:
    """Strict shape inference; a failure inside a function body is a warning if ONNX Runtime runs the model."""
    if s.model is None or s.checker_error is not None:
        return
    try:
        onnx.shape_inference.infer_shapes(s.model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        text = str(exc).strip()
        m = _SHAPE_NODE_RE.search(text)
        element = f"{m.group(1)} {m.group(2)!r}" if m else None
        inside = _FUNCTION_BODY_RE.search(text)
        ev: dict[str, Any] = {"error": _short(text), "op_type": m.group(1) if m else None}
        ev["node"] = m.group(2) if m else None
        if inside:
            from usg.doctor.onnx.probe import run_once

            probe = run_once(s.model, size=s.size)
            if probe is not None and probe.ok:
                op = inside.group(1)
                yield _f(
                    C_SHAPE,
                    s,
                    f"strict shape inference fails inside the function body of {op}, but ONNX Runtime loads "
                    f"and runs the model: {_short(text, 200)}",
                    f"nothing blocks serving on ONNX Runtime; other runtimes that expand {op} from its "
                    "function body may refuse it: test there before deploying",
                    element=element or op,
                    severity=W,
                    function_op=op,
                    ran_on_onnxruntime=True,
                    **ev,
                )
                return
        yield _f(
            C_SHAPE,
            s,
            f"shape inference fails: {_short(text, 300)}",
            "the shapes/dtypes feeding this node are inconsistent; re-export with the real "
            "input shapes, or fix the value_info written by graph surgery",
            element=element,
            **ev,
        )


def _custom_ops(s: OnnxSubject) -> list[tuple[str, str, str]]:
    assert s.model is not None
    local_functions = {(fn.domain, fn.name) for fn in s.model.functions}
    out = []
    for node in s.model.graph.node:
        if node.domain not in KNOWN_DOMAINS and (node.domain, node.op_type) not in local_functions:
            out.append((node.domain, node.op_type, node.name))
    return out


@check("onnx", codes=[C_CUSTOM])
def check_custom_domains(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None:
        return
    seen: dict[tuple[str, str], list[str]] = {}
    for domain, op, name in _custom_ops(s):
        seen.setdefault((domain, op), []).append(name)
    for (domain, op), names in sorted(seen.items()):
        yield _f(
            C_CUSTOM,
            s,
            f"op {domain}:{op} ({len(names)} node(s)) has no implementation in the stock ONNX Runtime or TensorRT",
            f"register the custom-op library (SessionOptions.register_custom_ops_library) that "
            f"implements {domain}:{op}, or re-export without the custom op",
            element=names[0] or op,
            domain=domain,
            op_type=op,
            nodes=names[:10],
        )


def _missing_external(s: OnnxSubject) -> list[tuple[str, str]]:
    assert s.model is not None
    missing = []
    base = s.path.parent
    tensors = list(s.model.graph.initializer) + [
        a.t for n in s.model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        if not location or not (base / location).is_file():
            missing.append((t.name, location))
    return missing


@check("onnx", codes=[C_EXT])
def check_external_data(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None:
        return
    by_file: dict[str, list[str]] = {}
    for name, location in _missing_external(s):
        by_file.setdefault(location, []).append(name)
    for location, names in sorted(by_file.items()):
        expected = os.fspath(s.path.parent / location)
        yield _f(
            C_EXT,
            s,
            f"external-data file {location!r} is missing ({len(names)} tensor(s) point to it)",
            f"copy {location!r} next to the model (expected at {expected}); Triton model folders need "
            "it inside the version directory too",
            element=names[0],
            location=location,
            expected_path=expected,
            tensors=names[:10],
        )


@check("onnx", codes=[C_UNUSED_INIT, C_UNUSED_IN])
def check_unused(s: OnnxSubject) -> Iterator[Finding]:
    if s.model is None:
        return
    g = s.model.graph
    used: set[str] = set()
    for node in g.node:
        used.update(node.input)
        for attr in node.attribute:  # subgraphs (If/Loop/Scan) read outer-scope names
            for sub in [attr.g, *attr.graphs] if attr.type in (5, 10) else []:
                for sn in sub.node:
                    used.update(sn.input)
    used.update(o.name for o in g.output)
    inits = {t.name for t in g.initializer}
    unused_inits = [t.name for t in g.initializer if t.name not in used]
    if unused_inits:
        nbytes = sum(len(t.raw_data) for t in g.initializer if t.name in set(unused_inits))
        yield _f(
            C_UNUSED_INIT,
            s,
            f"{len(unused_inits)} initializer(s) are never read",
            "drop them (onnx.compose / onnxsim, or remove from graph.initializer)",
            element=unused_inits[0],
            initializers=unused_inits[:20],
            raw_bytes=nbytes,
        )
    for inp in g.input:
        if inp.name not in used and inp.name not in inits:
            yield _f(
                C_UNUSED_IN,
                s,
                f"graph input {inp.name!r} is never read",
                f"remove input {inp.name!r} from the graph (clients would still have to send it)",
                element=inp.name,
                input=inp.name,
            )


@check("onnx", codes=[C_NO_OUTPUTS, C_NEGATIVE_DIM])
def check_graph_signature(s: OnnxSubject) -> Iterator[Finding]:
    """What a server and its clients read from the graph's inputs and outputs."""
    if s.model is None:
        return
    g = s.model.graph
    if not g.output:
        yield _f(
            C_NO_OUTPUTS,
            s,
            f"the graph declares no outputs ({len(g.node)} node(s)): no request can be answered",
            "list the tensors to return in graph.output (torch.onnx.export: output_names=[...]; graph surgery: "
            "graph.output.append(onnx.helper.make_tensor_value_info(name, elem_type, shape)))",
            nodes=len(g.node),
        )
    for kind, values in (("input", g.input), ("output", g.output)):
        for v in values:
            dims = v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else []
            bad = [(axis, d.dim_value) for axis, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value < -1]
            if bad:
                axis, value = bad[0]
                yield _f(
                    C_NEGATIVE_DIM,
                    s,
                    f"graph {kind} {v.name!r} declares dimension {value} on axis {axis}",
                    f"give axis {axis} a symbolic name (e.g. 'batch', torch.onnx.export dynamic_axes) if it varies, "
                    "or its size if it is fixed",
                    element=v.name,
                    **{kind: v.name, "axis": axis, "dim_value": value},
                )
