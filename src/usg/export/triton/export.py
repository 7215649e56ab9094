"""``export_triton(graph, out_dir)``: write a Triton model repository for a graph.

Every config is built (and every problem collected) before a file is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from usg.errors import GraphError, GraphProblem, UsageError
from usg.export.triton.bls_export import bls_config, graph_yaml
from usg.export.triton.configs import (
    batching_for,
    config_text,
    make_config,
    model_instances,
    model_tensors,
    ort_parameters,
)
from usg.export.triton.ensemble import ensemble_config, fn_model_config
from usg.export.triton.plan import ENSEMBLE, ExportPlan, plan_export
from usg.export.triton.repository import (
    copy_modules,
    install_file,
    local_modules,
    model_files,
    prepare_out_dir,
    relative,
    write_model_py,
)
from usg.graph import Graph

__all__ = ["ONNX_VIA", "ExportedModel", "TritonExport", "export_triton"]

ONNX_VIA = ("onnxruntime", "python")


@dataclass(frozen=True)
class ExportedModel:
    """One model of the written repository, as the CLI lists it."""

    name: str
    kind: str  # onnx | the USG backend (tokenizer, python) | fn | ensemble | bls
    runtime: str  # the config's platform or backend
    max_batch_size: int
    instances: int  # 0 for an ensemble (it has none)
    serves: str  # "model det", "node lines", "graph document-ocr"


@dataclass(frozen=True)
class TritonExport:
    """What :func:`export_triton` wrote: the repository, ensemble or BLS (and why), the models."""

    out_dir: Path
    mode: str
    reasons: tuple[str, ...]
    models: tuple[ExportedModel, ...]


@dataclass
class _Pending:
    config: Any
    kind: str
    serves: str
    file: tuple[Path, str] | None = None  # (source file, name in the version folder)
    model_py: tuple[str, str] | None = None  # (module, class) of a Python-backend model
    modules: tuple[Path, ...] = ()
    extra: tuple[tuple[str, str], ...] = ()  # (name in the version folder, text)


def _model_entries(graph: Graph, plan: ExportPlan, onnx_via: str) -> tuple[list[_Pending], dict[str, list[str]]]:
    entries: list[_Pending] = []
    item_axis: dict[str, list[str]] = {}
    problems: list[GraphProblem] = []
    for name, triton_name in plan.models.items():
        model = graph.models[name]
        io = plan.io[name]
        try:
            batching = batching_for(model, io)
        except GraphError as exc:
            problems += exc.problems
            continue
        ins, outs = model_tensors(io, batching.batched)
        item_axis[name] = [t.name for t in [*ins, *outs] if t.item_axis]
        assert model.path is not None
        onnx = model.backend == "onnxruntime"
        native = onnx and onnx_via == "onnxruntime"
        file_name = "model.onnx" if onnx else model.path.name
        params: dict[str, Any] = (
            ort_parameters(model)
            if native
            else {
                "usg_backend": model.backend,
                "usg_file": file_name,
                "usg_options": dict(model.options),
                "usg_item_axis": item_axis[name],
            }
        )
        config = make_config(
            triton_name,
            platform="onnxruntime_onnx" if native else "",
            backend="" if native else "python",
            batching=batching,
            inputs=ins,
            outputs=outs,
            instances=model_instances(graph, model),
            parameters=params,
        )
        entries.append(
            _Pending(
                config,
                "onnx" if onnx else model.backend,
                f"model {name} ({model.backend})",
                file=(model.path, file_name),
                model_py=None if native else ("usg.export.triton.python_models", "UsgModel"),
            )
        )
    if problems:
        raise GraphError(problems, source=str(graph.source) if graph.source else graph.name)
    return entries, item_axis


def _graph_entries(graph: Graph, plan: ExportPlan, item_axis: dict[str, list[str]], out: Path) -> list[_Pending]:
    if plan.mode == ENSEMBLE:
        entries = [_Pending(ensemble_config(graph, plan), "ensemble", f"graph {graph.name}")]
        for node in plan.fn_models:
            fn = graph.nodes[node].fn or ""
            entries.append(
                _Pending(
                    fn_model_config(graph, plan, node),
                    "fn",
                    f"node {node} ({fn})",
                    model_py=("usg.export.triton.python_models", "FnNodeModel"),
                    modules=tuple(local_modules([fn])),
                )
            )
        return entries
    version_dir = out / plan.graph_model / "1"
    paths = {}
    for name, triton_name in plan.models.items():
        model = graph.models[name]
        assert model.path is not None
        file_name = "model.onnx" if model.backend == "onnxruntime" else model.path.name
        paths[name] = relative(out / triton_name / "1" / file_name, version_dir)
    refs = [n.fn for n in graph.nodes.values() if n.fn] + [
        str(m.options["callable"]) for m in graph.models.values() if m.options.get("callable")
    ]
    return [
        _Pending(
            bls_config(graph, plan, item_axis),
            "bls",
            f"graph {graph.name}",
            model_py=("usg.export.triton.bls", "GraphModel"),
            modules=tuple(local_modules(refs)),
            extra=(("graph.yaml", graph_yaml(graph, paths)),),
        )
    ]


def _version_dir(entry: _Pending, out: Path) -> Path:
    return out / entry.config.name / "1"


def _write(entry: _Pending, out: Path, link: bool, files: list[tuple[Path, Path]] | None) -> ExportedModel:
    c = entry.config
    model_dir = out / c.name
    version_dir = _version_dir(entry, out)
    version_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_text(c), encoding="utf-8")
    if entry.file is not None:
        install_file(entry.file[0], version_dir / entry.file[1], link=link, pairs=files)
    if entry.model_py is not None:
        write_model_py(version_dir, entry.model_py[1], entry.serves, module=entry.model_py[0])
    copy_modules(entry.modules, version_dir)
    for name, text in entry.extra:
        (version_dir / name).write_text(text, encoding="utf-8")
    instances = sum(g.count for g in c.instance_group)
    return ExportedModel(c.name, entry.kind, c.platform or c.backend, int(c.max_batch_size), instances, entry.serves)


def export_triton(
    graph: Graph, out_dir: str | Path, *, link: bool = False, onnx_via: str = "onnxruntime", force: bool = False
) -> TritonExport:
    """Write a Triton model repository for ``graph`` into ``out_dir``.

    ``link`` symlinks model files instead of copying them; ``onnx_via="python"`` serves ONNX
    models with ONNX Runtime inside Python-backend models (for Triton builds without the
    onnxruntime backend); ``force`` empties a non-empty ``out_dir`` first.
    """
    if onnx_via not in ONNX_VIA:
        raise UsageError(f"onnx_via is {onnx_via!r}; fix: use one of {', '.join(ONNX_VIA)}")
    out = Path(out_dir).expanduser()
    plan = plan_export(graph)
    models, item_axis = _model_entries(graph, plan, onnx_via)
    entries = models + _graph_entries(graph, plan, item_axis, out)
    # model files and their external data are checked before OUT_DIR is touched
    files = [None if e.file is None else model_files(e.file[0], _version_dir(e, out) / e.file[1]) for e in entries]
    prepare_out_dir(out, force=force, keep=[graph.source] if graph.source else [])
    written = tuple(_write(e, out, link, f) for e, f in zip(entries, files, strict=True))
    return TritonExport(out, plan.mode, plan.reasons, written)
