"""USG graph checks: build errors as findings, and an optional dry run.

Static: ``usg.graph.load_graph`` collects every build problem into one
:class:`usg.errors.GraphError`; each :class:`GraphProblem` becomes a finding whose
code names its kind (GRAPH001-GRAPH009), located at the YAML line of its
``where`` path. Dry run (``usg doctor --dry-run``): synthetic inputs built from
the declared input specs go through :class:`usg.runtime.Executor`, so each
model input's contract is checked at run time (GRAPH020-GRAPH022).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, Location, RootCause, Severity, Stage
from usg.doctor.registry import CodeInfo, check, finding
from usg.doctor.runner import CheckContext
from usg.errors import GraphError, GraphProblem, USGError

__all__ = ["classify_problem", "sample_inputs"]

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO

C_SYNTAX = CodeInfo(
    "GRAPH001",
    E,
    RootCause.CONFIG_INVALID,
    "graph file unreadable or malformed YAML",
    "The graph file cannot be read or is not a YAML mapping.",
)
C_FIELD = CodeInfo(
    "GRAPH002",
    E,
    RootCause.CONFIG_INVALID,
    "invalid graph field",
    "An unknown key, a value of the wrong kind, or a node/graph missing a required part.",
)
C_REF = CodeInfo(
    "GRAPH003",
    E,
    RootCause.CONFIG_INVALID,
    "unresolved reference",
    "A wiring names an input, node, port or model that does not exist, or a model input is left unwired.",
)
C_CYCLE = CodeInfo(
    "GRAPH004", E, RootCause.CONFIG_INVALID, "cycle in the graph", "Nodes depend on each other in a loop."
)
C_DTYPE = CodeInfo(
    "GRAPH005",
    E,
    RootCause.DTYPE_OR_RANGE,
    "edge dtype/range/layout mismatch",
    "A producer's declared dtype, value range or layout does not match what the consumer "
    "declares (e.g. uint8 HWC into a float32 NCHW model).",
)
C_SHAPE = CodeInfo(
    "GRAPH006",
    E,
    RootCause.SHAPE_OR_RANK,
    "edge shape/rank mismatch",
    "A producer's declared rank or dims, or list-vs-tensor (map), do not fit the consumer.",
)
C_MODEL = CodeInfo(
    "GRAPH007",
    E,
    RootCause.ENVIRONMENT,
    "model file missing or unreadable",
    "A model's path does not exist or cannot be opened.",
)
C_IMPORT = CodeInfo(
    "GRAPH008",
    E,
    RootCause.ENVIRONMENT,
    "backend or function not available",
    "An unknown backend name, or a fn that cannot be imported.",
)
C_BATCH = CodeInfo(
    "GRAPH009",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "invalid batching policy",
    "A model's batch/pad policy is inconsistent (sizes, axes, multiples, buckets).",
)
C_DEPLOY = CodeInfo(
    "GRAPH010",
    W,
    RootCause.BATCH_DIM_CONFIG,
    "deploy: a replica cannot fill its batches",
    "A model's deploy max_ongoing_requests is below its batch max_size × options.concurrency, so a "
    "Ray Serve replica never holds enough requests to fill its batches (the batch policy is moot).",
)
C_CONTRACT = CodeInfo(
    "GRAPH020",
    E,
    RootCause.DTYPE_OR_RANGE,
    "dry run: contract broken at run time",
    "Synthetic inputs pushed through the graph reach a model input that breaks its "
    "contract (dtype, rank, dims, range).",
)
C_RUNFAIL = CodeInfo(
    "GRAPH021",
    E,
    RootCause.UNCLASSIFIED,
    "dry run: a node failed",
    "A node or model raised while running synthetic inputs.",
)
C_NOEXEC = CodeInfo(
    "GRAPH022",
    N,
    RootCause.ENVIRONMENT,
    "dry run not performed",
    "The dry run was skipped: the graph does not build, or an input has no sample.",
)

_KINDS: list[tuple[CodeInfo, re.Pattern[str]]] = [
    (C_SYNTAX, re.compile(r"malformed YAML|cannot read graph file|graph file does not exist|top level is")),
    (C_CYCLE, re.compile(r"\bcycle\b")),
    (C_MODEL, re.compile(r"model file .* does not exist|cannot read model|no path given|pkg://|USG_CACHE")),
    (C_IMPORT, re.compile(r"unknown backend|cannot import|not importable|no attribute|No module named")),
    (
        C_REF,
        re.compile(r"unknown (graph input|node|model)|has no (output|input)|is not wired|not one of its inputs"),
    ),
    (C_SHAPE, re.compile(r"is a list, but|map over|\brank\b|\bdim \d|shape")),
    (C_DTYPE, re.compile(r"\bdtype\b|\brange\b|\blayout\b")),
]


def classify_problem(problem: GraphProblem) -> CodeInfo:
    """The finding code for one build problem, from its message and where-path."""
    text = f"{problem.message}"
    if re.search(r"\.batch(\.|$)", problem.where) or ".pad" in problem.where:
        return C_BATCH
    for info, rx in _KINDS:
        if rx.search(text):
            return info
    if re.search(r"\.path$", problem.where):
        return C_MODEL
    return C_FIELD


@dataclass
class _Built:
    graph: Any = None
    error: GraphError | None = None
    text: str = ""


def _build(path: Path) -> _Built:
    from usg.graph import load_graph

    built = _Built()
    try:
        built.text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        built.text = ""
    try:
        built.graph = load_graph(path)
    except GraphError as exc:
        built.error = exc
    return built


def _built(path: Path, ctx: CheckContext) -> _Built:
    return ctx.cached(("graph", path.resolve()), lambda: _build(path))


_YAML_POS = re.compile(r":(\d+):(\d+)$")


def line_for(text: str, where: str) -> int | None:
    """Best-effort 1-based line of a dotted where-path (``nodes.det.inputs.x``) in the YAML text."""
    lines = text.splitlines()
    start, found = 0, None
    for part in where.split("."):
        rx = re.compile(rf"(^|[\s{{,])['\"]?{re.escape(part)}['\"]?\s*:")
        for i in range(start, len(lines)):
            if rx.search(lines[i]):
                found, start = i + 1, i + 1 if not lines[i].rstrip().endswith("}") else i
                break
        else:
            break
    return found


@check("graph", codes=[C_SYNTAX, C_FIELD, C_REF, C_CYCLE, C_DTYPE, C_SHAPE, C_MODEL, C_IMPORT, C_BATCH])
def check_graph_builds(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    built = _built(path, ctx)
    if built.error is None:
        return
    for p in built.error.problems:
        info = classify_problem(p)
        line = column = None
        element: str | None = p.where
        if m := _YAML_POS.search(p.where):
            line, column, element = int(m.group(1)), int(m.group(2)), None
        elif built.text:
            line = line_for(built.text, p.where)
        yield finding(
            info,
            message=p.message,
            where=Location(str(path), element, line, column),
            fix=p.fix,
            evidence={"where": p.where},
        )


@check("graph", codes=[])
def check_graph_models(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    """Run the ONNX checks on every ONNX Runtime model the (built) graph loads."""
    from usg.doctor.detect import Target
    from usg.doctor.runner import check_target

    built = _built(path, ctx)
    if built.graph is None:
        return
    for model in built.graph.models.values():
        p = model.path
        if model.backend == "onnxruntime" and p is not None and Path(p).suffix == ".onnx" and Path(p).is_file():
            yield from check_target(Target("onnx", Path(p)), ctx)


@check("graph", codes=[C_DEPLOY])
def check_graph_deploy(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    """The deploy: section against the batch policies it must serve (Ray engine)."""
    built = _built(path, ctx)
    if built.graph is None:
        return
    for name, policy in built.graph.deploy.models.items():
        model = built.graph.models[name]
        need = model.batch.max_size * max(1, int(model.options.get("concurrency", 1)))
        cap = policy.max_ongoing_requests
        if cap is not None and model.batch.enabled and cap < need:
            size, batches = model.batch.max_size, need // model.batch.max_size
            effect = (
                f"batches of {size} can never form"
                if cap < size
                else f"at most {cap // size} of its {batches} concurrent batches can be full"
            )
            yield finding(
                C_DEPLOY,
                message=(
                    f"model {name!r}: deploy max_ongoing_requests {cap} < batch max_size {size} "
                    f"× concurrency {batches}; {effect}"
                ),
                where=Location(
                    str(path),
                    f"deploy.models.{name}.max_ongoing_requests",
                    line_for(built.text, f"deploy.models.{name}.max_ongoing_requests") if built.text else None,
                    None,
                ),
                fix=f"raise max_ongoing_requests to at least {need} (or drop it: the default is {max(16, 2 * need)}), "
                "or lower batch.max_size",
                evidence={"max_ongoing_requests": cap, "max_size": model.batch.max_size, "needed": need},
            )


def _glyph_line() -> Any:
    """A white 96x160 image with one line of dark letter-like glyphs (stems and bars).

    A text detector finds a line in it (PP-OCRv4 det boxes it and rec reads it), so the dry run
    reaches the nodes behind the detector: crops, cls, rec. A plain dark bar is found by no
    detector, and every per-line node ran on an empty list.
    """
    import numpy as np

    img = np.full((96, 160, 3), 255, np.uint8)
    for i, x in enumerate(range(16, 140, 12)):
        img[34:62, x : x + 3] = 0  # stem
        img[34:37, x : x + 9] = 0  # top bar
        if i % 2:
            img[46:49, x : x + 8] = 0  # middle bar: an F
        else:
            img[59:62, x : x + 9] = 0  # bottom bar: an L
    return img


def sample_inputs(graph: Any) -> dict[str, Any]:
    """One synthetic value per graph input, from its modality and declared spec (a ``timestamped``
    input gets a list of one item at ts_ms 0, the form requests send)."""
    import numpy as np

    from usg.runtime.inputs import ITEM_KEYS
    from usg.specs import Modality

    out: dict[str, Any] = {}
    for name, d in graph.inputs.items():
        spec = d.spec
        if d.modality is Modality.TEXT:
            out[name] = "usg doctor dry run: invoice total 42.00"
        elif d.modality is Modality.IMAGE:
            out[name] = _glyph_line()
        else:
            dtype = spec.dtype if spec is not None and spec.dtype else "float32"
            shape = [d_ if isinstance(d_, int) else 2 for d_ in (spec.shape or (16000,))] if spec else [16000]
            lo = spec.range[0] if spec is not None and spec.range is not None else 0
            out[name] = np.full(shape, lo, dtype=dtype)
        if d.timestamped:
            out[name] = [{ITEM_KEYS[d.modality]: out[name], "ts_ms": 0.0}]
    return out


@check("graph", codes=[C_CONTRACT, C_RUNFAIL, C_NOEXEC])
def check_graph_dry_run(path: Path, ctx: CheckContext) -> Iterator[Finding]:
    if not ctx.dry_run:
        return
    built = _built(path, ctx)
    loc = Location(str(path))
    if built.graph is None:
        yield finding(
            C_NOEXEC,
            "dry run skipped: the graph does not build (see the GRAPH00x findings)",
            loc,
            "fix the build problems, then re-run with --dry-run",
            stage=Stage.DRY_RUN,
        )
        return
    from usg.errors import ContractError
    from usg.runtime import Executor

    inputs = sample_inputs(built.graph)
    shapes = {k: (list(v.shape), str(v.dtype)) if hasattr(v, "shape") else type(v).__name__ for k, v in inputs.items()}
    try:
        with Executor(built.graph, timeout_s=120.0) as ex:
            result = ex.infer_sync(inputs)
    except ContractError as exc:
        field = getattr(exc, "field", None)
        yield finding(
            C_CONTRACT,
            f"dry run: {exc}",
            Location(str(path), field, line_for(built.text, f"nodes.{field}") if field else None),
            getattr(exc, "fix", None) or "make the producing node emit what the model declares",
            evidence={"inputs": shapes, "error": str(exc)},
            stage=Stage.DRY_RUN,
        )
        return
    except USGError as exc:
        yield finding(
            C_RUNFAIL,
            f"dry run: {type(exc).__name__}: {exc}",
            loc,
            "run the graph with usg run on a real input and fix the node named in the error",
            evidence={"inputs": shapes, "error": str(exc)},
            stage=Stage.DRY_RUN,
        )
        return
    except Exception as exc:  # a node function crashed outside USG's error tree
        yield finding(
            C_RUNFAIL,
            f"dry run: {type(exc).__name__}: {exc}",
            loc,
            "run the graph with usg run on a real input and fix the node named in the error",
            evidence={"inputs": shapes, "error": f"{type(exc).__name__}: {exc}"},
            stage=Stage.DRY_RUN,
        )
        return
    del result
