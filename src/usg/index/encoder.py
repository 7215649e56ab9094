"""The text encoder of a document graph, run through the executor, many lines per request.

A document graph (the bundled ``examples/document_ocr/graph.yaml``) embeds a query text with a
tokenizer model and an encoder model (``text_tok`` → ``text_emb``). :func:`find_text_encoder`
finds that chain; :class:`LineEncoder` runs the *same* two models (same files, same batching
policies) in a derived graph whose input is a list of lines, mapped item by item so the
encoder's batcher packs many lines of one request into each call. The encoder is identified by
the SHA-256 of its ONNX file (:func:`file_digest`): an index records it, and refuses query
embeddings made by another encoder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import GraphError, GraphProblem
from usg.graph import Graph, InputDef, NodeDef, Ref, validate_graph
from usg.runtime import Executor
from usg.specs import Modality

__all__ = ["EncoderChain", "LineEncoder", "file_digest", "find_text_encoder", "line_graph", "query_graph"]

_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file, hex (memoised per path, size and mtime: an ONNX encoder is ~90 MB)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    cached = _DIGESTS.get(key)
    if cached is None:
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        cached = _DIGESTS[key] = h.hexdigest()
    return cached


@dataclass(frozen=True)
class EncoderChain:
    """Where a graph embeds a text: its text input, the tokenizer node and the encoder node."""

    text_input: str
    tokenizer_node: str
    encoder_node: str
    output: str  # the graph output carrying the query embedding (e.g. "text_embedding")
    image_input: str | None  # the image input, if the graph OCRs images
    lines_output: str | None  # the graph output with OCR lines ({"text", "box", "score"} each)
    page_output: str | None  # the graph output embedding a page's OCR text (e.g. "ocr_embedding")

    def encoder_path(self, graph: Graph) -> Path:
        model = graph.models[graph.nodes[self.encoder_node].model or ""]
        assert model.path is not None
        return model.path


def _problem(graph: Graph, message: str) -> GraphError:
    return GraphError(
        [
            GraphProblem(
                "inputs",
                message,
                "index with a graph that embeds a text input through a tokenizer model and an encoder "
                "model (text → tok → emb → output), like examples/document_ocr/graph.yaml",
            )
        ],
        source=str(graph.source or graph.name),
    )


def find_text_encoder(graph: Graph) -> EncoderChain:
    """The text → tokenizer → encoder → output chain of ``graph`` (GraphError when it has none)."""
    for inp in graph.inputs.values():
        if inp.modality is not Modality.TEXT:
            continue
        for tok_name, tok in graph.nodes.items():
            if tok.model is None or graph.models[tok.model].backend != "tokenizer":
                continue
            if not any(r.is_graph_input and r.port == inp.name for r in tok.inputs.values()):
                continue
            for enc_name in graph.consumers(tok_name):
                enc = graph.nodes[enc_name]
                model = graph.models.get(enc.model or "")
                if model is None or model.path is None or model.path.suffix != ".onnx":
                    continue
                outs = [o for o, r in graph.outputs.items() if r.source == enc_name]
                if outs:
                    return _with_ocr(graph, EncoderChain(inp.name, tok_name, enc_name, outs[0], None, None, None))
    raise _problem(graph, f"graph {graph.name!r} has no text input embedded by a tokenizer + ONNX encoder")


def _with_ocr(graph: Graph, chain: EncoderChain) -> EncoderChain:
    """Fill the image side: an image input, an output of OCR lines, and the page-text embedding output."""
    images = [i.name for i in graph.inputs.values() if i.modality is Modality.IMAGE]
    if not images:
        return chain
    enc_model = graph.nodes[chain.encoder_node].model
    lines_out = page_out = None
    for out, ref in graph.outputs.items():
        node = graph.nodes.get(ref.source)
        if node is None or out == chain.output:
            continue
        if ref.port == "lines" and node.fn is not None:
            lines_out = out
        elif node.model == enc_model:
            page_out = out
    return EncoderChain(
        chain.text_input, chain.tokenizer_node, chain.encoder_node, chain.output, images[0], lines_out, page_out
    )


def line_graph(graph: Graph, chain: EncoderChain) -> Graph:
    """A graph of the same tokenizer and encoder models whose input ``lines`` is a list of strings."""
    tok, enc = graph.nodes[chain.tokenizer_node], graph.nodes[chain.encoder_node]
    assert tok.model is not None and enc.model is not None
    tok_port = next(p for p, r in tok.inputs.items() if r.is_graph_input)
    enc_out = graph.outputs[chain.output].port
    nodes = {
        "tok": NodeDef("tok", {tok_port: Ref("inputs", "lines")}, model=tok.model, map=(tok_port,)),
        "emb": NodeDef(
            "emb",
            {p: Ref("tok", r.port) for p, r in enc.inputs.items()},
            model=enc.model,
            map=tuple(enc.inputs),
        ),
    }
    models = {m: graph.models[m] for m in (tok.model, enc.model)}
    return validate_graph(
        f"{graph.name}-lines",
        {"lines": InputDef("lines", Modality.TENSOR)},
        models,
        nodes,
        {"embedding": Ref("emb", enc_out)},
    )


def query_graph(graph: Graph, chain: EncoderChain) -> Graph:
    """Only the text side of ``graph``: its text input, tokenizer and encoder, and the query-embedding output
    (loads two models instead of the whole pipeline)."""
    tok, enc = graph.nodes[chain.tokenizer_node], graph.nodes[chain.encoder_node]
    assert tok.model is not None and enc.model is not None
    return validate_graph(
        f"{graph.name}-query",
        {chain.text_input: graph.inputs[chain.text_input]},
        {m: graph.models[m] for m in (tok.model, enc.model)},
        {tok.name: tok, enc.name: enc},
        {chain.output: graph.outputs[chain.output]},
    )


class LineEncoder:
    """Embeds lists of lines with a graph's own tokenizer and encoder (one executor, batched).

    Use as a context manager, or call :meth:`close`. ``chunk`` lines go in one request.
    """

    def __init__(self, graph: Graph, *, chunk: int = 512, timeout_s: float = 600.0) -> None:
        self.chain = find_text_encoder(graph)
        self.graph = line_graph(graph, self.chain)
        self.digest = file_digest(self.chain.encoder_path(graph))
        # one request's lines all wait in the encoder's queue: never more than it admits
        enc_model = graph.models[graph.nodes[self.chain.encoder_node].model or ""]
        self.chunk = max(1, min(chunk, enc_model.batch.max_queue))
        self._executor = Executor(self.graph, timeout_s=timeout_s)
        self.dim = 384

    def encode(self, lines: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        """``[len(lines), dim]`` float32 embeddings (L2-normalised by the encoder), in the order given.

        Lines are sent sorted by length, so each request's batches hold lines of similar token
        counts (little padding), and put back in order.
        """
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        parts: list[np.ndarray[Any, Any]] = []
        for start in range(0, len(order), self.chunk):
            batch = [str(lines[i]) for i in order[start : start + self.chunk]]
            out = self._executor.infer_sync({"lines": batch})
            parts.extend(np.asarray(e, dtype=np.float32).reshape(1, -1) for e in out.outputs["embedding"])
        if not parts:
            return np.zeros((0, self.dim), np.float32)
        sorted_emb = np.concatenate(parts, axis=0)
        self.dim = sorted_emb.shape[1]
        result = np.empty_like(sorted_emb)
        result[np.asarray(order, dtype=np.int64)] = sorted_emb
        return result

    def close(self) -> None:
        self._executor.close()

    def __enter__(self) -> LineEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
