"""Prompt building for LLM nodes without Python: :func:`chat` makes the messages a ``backend: openai``
model takes from named graph values and a template in the node's options; :func:`complete` makes
the prompt string of a model with ``endpoint: completions``.

Example node::

    prompt:
      fn: usg.ops.llm:chat
      inputs: {question: inputs.question, lines: lines.lines}
      options:
        system: "Answer from the document text."
        user: "Question: {question}"
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from usg.errors import InputError
from usg.ops.signature import op
from usg.specs import TensorSpec

__all__ = ["chat", "complete", "image_data_url", "join_lines"]

DEFAULT_LINES_HEADER = "Text read from the document, one line each:"


def image_data_url(image: np.ndarray) -> str:
    """A base64 PNG data URL of an RGB uint8 HWC image (the OpenAI ``image_url`` content part)."""
    from PIL import Image

    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise InputError(
            f"chat: image is {arr.dtype.name}{list(arr.shape)}, not an HxWx3 uint8 RGB array",
            field="image",
            fix="wire the graph's image input (modality: image) to the chat node",
        )
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def join_lines(lines: Sequence[Any], *, max_lines: int | None = None) -> str:
    """OCR lines (``usg.ops.ocr:ctc_decode`` dicts with ``text``, or strings) joined with newlines;
    a string is its own lines."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    texts = [str(line["text"]) if isinstance(line, Mapping) else str(line) for line in lines]
    if max_lines is not None:
        texts = texts[:max_lines]
    return "\n".join(texts)


def _fill(template: str, values: Mapping[str, Any], where: str) -> str:
    try:
        return template.format_map({k: (join_lines(v) if isinstance(v, list) else v) for k, v in values.items()})
    except KeyError as exc:
        raise InputError(
            f"chat: the {where} template names {{{exc.args[0]}}}, which is not an input of the node "
            f"(inputs: {sorted(values)})",
            field=where,
            fix=f"wire {exc.args[0]}: NODE.PORT under the node's inputs, or remove the placeholder",
        ) from None


def _text_only(inputs: Mapping[str, Any]) -> bool:
    """A prompt without an image takes microseconds: built on the event loop, no thread hop."""
    return inputs.get("image") is None


@op(
    inputs={"image": TensorSpec("uint8", (None, None, 3), layout="HWC"), "lines": None},
    outputs={"messages": None},
    inline=_text_only,
)
def chat(
    *,
    system: str = "",
    user: str = "{question}",
    lines_header: str = DEFAULT_LINES_HEADER,
    max_lines: int = 200,
    image: np.ndarray | None = None,
    lines: Sequence[Any] | None = None,
    vlm: bool = True,
    **values: Any,
) -> dict[str, Any]:
    """Chat messages: ``system`` text, then one user message from the ``user`` template.

    Placeholders (``{question}``) are filled from the node's inputs by name. OCR ``lines``
    (at most ``max_lines``) go after ``lines_header`` ahead of the user text unless the
    template places them itself with ``{lines}``. An ``image`` is sent as a base64 PNG
    ``image_url`` part ahead of the text (for a vision-language model) unless ``vlm`` is false
    (set it in the graph's ``options:`` for every node, or in the node's): then only its OCR
    lines reach the model.
    """
    fields = dict(values)
    text = _with_lines(user, fields, lines, lines_header, max_lines, "user")
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": _fill(system, fields, "system")})
    if image is None or not vlm:
        messages.append({"role": "user", "content": text})
    else:
        parts = [{"type": "image_url", "image_url": {"url": image_data_url(image)}}, {"type": "text", "text": text}]
        messages.append({"role": "user", "content": parts})
    return {"messages": messages}


def _with_lines(
    template: str, fields: dict[str, Any], lines: Sequence[Any] | None, header: str, max_lines: int, where: str
) -> str:
    """``template`` filled from ``fields``; OCR ``lines`` ahead of it unless it places ``{lines}``."""
    if lines is not None:
        fields["lines"] = join_lines(lines, max_lines=max_lines)
    text = _fill(template, fields, where)
    if lines is not None and "{lines}" not in template and fields["lines"]:
        text = f"{header}\n{fields['lines']}\n\n{text}"
    return text


@op(inputs={"lines": None}, outputs={"prompt": None})
def complete(
    *,
    template: str = "{question}",
    lines_header: str = DEFAULT_LINES_HEADER,
    max_lines: int = 200,
    lines: Sequence[Any] | None = None,
    **values: Any,
) -> dict[str, Any]:
    """A completion prompt (``endpoint: completions``: sent as it is, no chat template): the
    ``template`` filled from the node's inputs by name, with OCR ``lines`` ahead of it unless
    it places them with ``{lines}``. Wire it as the model's ``messages``."""
    return {"prompt": _with_lines(template, dict(values), lines, lines_header, max_lines, "template")}
