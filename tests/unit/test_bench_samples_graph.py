"""Which graphs take the built-in document samples (usg bench / tune / quantize)."""

from __future__ import annotations

import pytest

from usg.bench.samples import default_samples, takes_documents
from usg.errors import UsageError
from usg.graph import GraphBuilder


def _graph(*inputs: tuple[str, str, bool]):
    b = GraphBuilder("g")
    for name, modality, optional in inputs:
        b.input(name, modality, optional=optional)
    b.node(
        "n",
        fn="testops:upper",
        inputs={"text": "inputs.text" if any(i[0] == "text" for i in inputs) else f"inputs.{inputs[0][0]}"},
    )
    b.output("y", "n.text")
    return b.build()


def test_a_document_graph_with_an_optional_extra_input_takes_the_document_samples():
    """An optional input besides image and text (a language hint) made the graph refuse the samples it runs."""
    graph = _graph(("image", "image", True), ("text", "text", True), ("lang", "text", True))
    assert takes_documents(graph)
    assert default_samples(graph)


def test_a_graph_that_needs_another_input_is_refused_the_document_samples():
    graph = _graph(("text", "text", False), ("lang", "text", False))
    assert not takes_documents(graph)
    with pytest.raises(UsageError, match=r"graph 'g' takes lang, text, not the built-in document and text samples"):
        default_samples(graph)
