"""The document-OCR pipeline written by hand, as teams write it around model services.

The baselines call the models their own way (HTTP, Ray handles) but do the pre- and
post-processing with the same ``usg.ops.ocr`` functions and options as the graph, so any
output difference is a bug, not a different algorithm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from usg.bench.samples import Sample
from usg.errors import UsageError
from usg.graph.model import Graph

__all__ = ["DocModels", "doc_models", "group_by_shape", "run_document"]

AsyncArrays = Callable[[list[np.ndarray]], Awaitable[list[np.ndarray]]]
AsyncTexts = Callable[[list[str]], Awaitable[list[np.ndarray]]]

_REQUIRED_MODELS = ("det", "cls", "rec", "tokenizer", "minilm")


@dataclass(frozen=True)
class DocModels:
    """Paths, thread counts and batch policies of the document-OCR graph's models."""

    paths: dict[str, Path]
    threads: dict[str, int]
    max_batch: dict[str, int]
    max_delay_ms: dict[str, float]
    tokenizer_max_length: int
    instances: dict[str, int] = field(default_factory=dict)  # options.concurrency
    node_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def doc_models(graph: Graph, baseline: str) -> DocModels:
    missing = [m for m in _REQUIRED_MODELS if m not in graph.models]
    if missing or "lines" not in graph.nodes:
        raise UsageError(
            f"baseline {baseline!r} re-implements the document-OCR pipeline (models "
            f"{', '.join(_REQUIRED_MODELS)}); graph {graph.name!r} lacks {', '.join(missing) or 'node lines'}; "
            "fix: compare this graph with --compare sequential only"
        )
    paths: dict[str, Path] = {}
    for name in _REQUIRED_MODELS:
        path = graph.models[name].path
        if path is None:
            raise UsageError(f"model {name!r} has no path; fix: declare path: in the graph")
        paths[name] = Path(path)
    return DocModels(
        paths=paths,
        threads={m: int(graph.models[m].options.get("intra_op_threads", 0) or 0) for m in _REQUIRED_MODELS},
        max_batch={m: max(1, graph.models[m].batch.max_size) for m in _REQUIRED_MODELS},
        max_delay_ms={m: graph.models[m].batch.max_delay_ms for m in _REQUIRED_MODELS},
        tokenizer_max_length=int(graph.models["tokenizer"].options.get("max_length", 512)),
        instances={m: max(1, int(graph.models[m].options.get("concurrency", 1))) for m in _REQUIRED_MODELS},
        node_options={n: dict(d.options) for n, d in graph.nodes.items()},
    )


def group_by_shape(items: Sequence[np.ndarray]) -> list[list[int]]:
    """Indices of items grouped by shape (only equal shapes can be stacked into one batch)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(tuple(item.shape), []).append(i)
    return list(groups.values())


async def run_document(
    sample: Sample,
    models: DocModels,
    *,
    det: Callable[[np.ndarray], Awaitable[np.ndarray]],
    cls: AsyncArrays,
    rec: AsyncArrays,
    embed: AsyncTexts,
    cpu: Callable[..., Awaitable[Any]] | None = None,
) -> dict[str, Any]:
    """Run one request through det → cls → rec (+ MiniLM on the OCR text and the query text, and
    with both, on each OCR line for the example's ``relevance`` output).

    ``det`` takes the [1,3,H,W] input and returns the probability map; ``cls``/``rec`` take a
    list of [1,…] items and return one output per item; ``embed`` takes texts and returns one
    [1,384] embedding per text. ``cpu`` runs a pre/post-processing call (default: a thread).
    """
    from usg.ops import ocr
    from usg.ops import text as text_ops

    run = cpu or _to_thread
    outputs: dict[str, Any] = {}
    query = asyncio.ensure_future(embed([sample.text])) if sample.text is not None else None
    try:
        if sample.image is not None:
            opts = models.node_options
            pre = await run(ocr.det_preprocess, sample.image, **opts.get("det_pre", {}))
            prob = await det(pre["x"])
            boxes = (await run(ocr.det_postprocess, prob, pre["meta"], **opts.get("boxes", {})))["boxes"]
            crops = (await run(ocr.crop_lines, boxes, pre["meta"]))["items"]
            if crops:
                cls_items = (await run(ocr.cls_preprocess, crops))["items"]
                cls_out = await cls(cls_items)
                rec_in = (await run(ocr.rec_preprocess, crops, cls_out, **opts.get("rec_pre", {})))["items"]
                rec_out = await rec(rec_in)
            else:
                rec_out = []
            decoded = await run(ocr.ctc_decode, rec_out, boxes, pre["meta"], **opts.get("lines", {}))
            outputs["lines"] = decoded["lines"]
            if decoded["text"] is not None:
                line_texts = [str(line["text"]) for line in decoded["lines"]] if query is not None else []
                embedded = await embed([decoded["text"], *line_texts])
                outputs["ocr_embedding"] = embedded[0]
                if query is not None:
                    relevance = text_ops.relevance(
                        query=(await query)[0], document=embedded[0], lines=embedded[1:], texts=line_texts
                    )
                    outputs["relevance"] = relevance["summary"]
    except BaseException:
        if query is not None:
            query.cancel()
            await asyncio.gather(query, return_exceptions=True)
        raise
    if query is not None:
        outputs["text_embedding"] = (await query)[0]
    return outputs


async def _to_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(func, *args, **kwargs)
