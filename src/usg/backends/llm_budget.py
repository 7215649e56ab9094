"""The token budget of a ``backend: openai`` model, checked before anything is sent to the engine.

prompt tokens (the model's own ``tokenizer.json``, else an over-estimate) + image tokens (from
the model's HF configs via :mod:`usg.vision_tokens`, for the size of each image actually sent) +
``max_tokens`` must fit ``max_model_len``; otherwise :class:`usg.errors.PayloadTooLarge` (413)
names every number and the fix.

Options read here: ``tokenizer`` (a ``tokenizer.json``), ``hf_model`` (the model's HF directory:
``config.json``, ``preprocessor_config.json``; its ``tokenizer.json`` is used when ``tokenizer``
is not given), ``image_tokens`` (a fixed count per image, overriding ``hf_model``).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from usg.errors import GraphError, GraphProblem, PayloadTooLarge
from usg.vision_tokens import ImageTokens, load_image_tokens

__all__ = ["PromptBudget", "PromptCount", "count_prompt_tokens", "data_url_size", "hf_context_len"]

_PER_MESSAGE_TOKENS = 8  # chat-template markers around each message (role, start/end tokens)
_ESTIMATED = "estimated at UTF-8 bytes / 3: no tokenizer.json in options.tokenizer or options.hf_model"
_COUNTED = "counted with the model's tokenizer"
_HEADER_B64 = (4096 // 3 * 4, 65536 // 3 * 4)  # base64 characters of an image's first 4 KiB, 64 KiB


def _parts(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The text of every message (content strings and text parts) and the URL of every image part."""
    texts: list[str] = []
    images: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or ():
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                ref = part.get("image_url")
                images.append(str(ref.get("url", "") if isinstance(ref, Mapping) else ref or ""))
    return texts, images


def _text_tokens(texts: Sequence[str], tokenizer: Any | None) -> int:
    if not texts:
        return 0
    if tokenizer is not None:
        return sum(len(e.ids) for e in tokenizer.encode_batch(list(texts), add_special_tokens=False))
    return sum(math.ceil(len(t.encode("utf-8")) / 3) for t in texts)


def count_prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tokenizer: Any | None = None, *, image_tokens: int = 0
) -> tuple[int, str]:
    """Prompt tokens of ``messages`` and how they were counted: exactly with a ``tokenizers``
    tokenizer, else an over-estimate (one token per 3 UTF-8 bytes, rounded up); every image
    counts ``image_tokens``."""
    texts, images = _parts(messages)
    overhead = _PER_MESSAGE_TOKENS * len(messages) + image_tokens * len(images)
    return _text_tokens(texts, tokenizer) + overhead, _COUNTED if tokenizer is not None else _ESTIMATED


def data_url_size(url: str) -> tuple[int, int] | None:
    """(height, width) of a base64 ``data:image/...`` URL, read from the image header (the pixels
    are not decoded); None for any other URL or an undecodable image."""
    if not url.startswith("data:") or ";base64," not in url[:100]:
        return None
    from PIL import Image, UnidentifiedImageError

    start = url.index(",") + 1
    # the header is at the start (PNG: 33 bytes; JPEG: its SOF, after any EXIF): decode 4 KiB, then 64 KiB
    ends = [start + n for n in _HEADER_B64 if start + n < len(url)] + [len(url)]
    for end in ends:
        try:
            with Image.open(io.BytesIO(base64.b64decode(url[start:end], validate=False))) as img:
                width, height = img.size
            return int(height), int(width)
        except (binascii.Error, ValueError, OSError, UnidentifiedImageError):
            continue
    return None


def hf_context_len(model_dir: Path) -> int | None:
    """``max_position_embeddings`` of a model's ``config.json`` (its text config first): the
    context vLLM serves by default; None when the file or the field is missing."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (cfg.get("text_config"), cfg) if isinstance(cfg, dict) else ():
        if isinstance(section, dict) and isinstance(section.get("max_position_embeddings"), int):
            return int(section["max_position_embeddings"])
    return None


@dataclass(frozen=True)
class PromptCount:
    """What one request costs before generation: text tokens and one count per image."""

    text: int
    how: str
    images: tuple[int, ...] = ()
    sizes: tuple[tuple[int, int] | None, ...] = ()
    image_rule: str = ""

    @property
    def total(self) -> int:
        return self.text + sum(self.images)


class PromptBudget:
    """Counts a request's prompt (chat messages or a completion prompt) and refuses what cannot fit."""

    def __init__(self, options: Mapping[str, Any], name: str) -> None:
        self.name = name
        self.tokenizer_path = Path(options["tokenizer"]) if options.get("tokenizer") else None
        self.hf_model = Path(options["hf_model"]) if options.get("hf_model") else None
        fixed = options.get("image_tokens")
        self.fixed_image_tokens: int | None = int(fixed) if fixed is not None else None
        self.tokenizer: Any = None
        self.vision: ImageTokens | None = None
        #: the context of ``hf_model`` (max_position_embeddings), used when the engine reports none
        self.context_len: int | None = None
        self._loaded = False

    def load(self) -> None:
        """Read the tokenizer and the image-token rule (once); a bad path is a graph error."""
        if self._loaded:
            return
        path = self.tokenizer_path
        if path is None and self.hf_model is not None and (self.hf_model / "tokenizer.json").is_file():
            path = self.hf_model / "tokenizer.json"
        if path is not None:
            from tokenizers import Tokenizer

            try:
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:  # tokenizers raises its own Exception subclass
                raise self._bad("tokenizer", path, f"{type(exc).__name__}: {exc}") from None
        if self.hf_model is not None and self.fixed_image_tokens is None:
            try:
                self.vision = load_image_tokens(self.hf_model)
            except (OSError, ValueError) as exc:
                raise self._bad("hf_model", self.hf_model, f"{type(exc).__name__}: {exc}") from None
        if self.hf_model is not None:
            self.context_len = hf_context_len(self.hf_model)
        self._loaded = True

    def _bad(self, option: str, path: Path, why: str) -> GraphError:
        return GraphError(
            [
                GraphProblem(
                    f"models.{self.name}.options.{option}",
                    f"cannot read {path}: {why}",
                    "point it at the model's Hugging Face directory (config.json, preprocessor_config.json, "
                    "tokenizer.json)"
                    if option == "hf_model"
                    else "point it at the model's tokenizer.json",
                )
            ]
        )

    def _image_tokens(self, url: str) -> tuple[int, tuple[int, int] | None]:
        if self.fixed_image_tokens is not None:
            return self.fixed_image_tokens, None
        if self.vision is None:
            return 0, None
        size = data_url_size(url)
        if size is None:  # a remote URL: the engine fetches it, so budget for the largest image
            return self.vision.worst()[0], None
        return self.vision.count(*size), size

    def count(self, prompt: Sequence[Mapping[str, Any]] | str) -> PromptCount:
        """The tokens ``prompt`` (chat messages, or a completion prompt string) takes."""
        self.load()
        how = _COUNTED if self.tokenizer is not None else _ESTIMATED
        if isinstance(prompt, str):
            return PromptCount(_text_tokens([prompt], self.tokenizer), how)
        texts, urls = _parts(prompt)
        text = _text_tokens(texts, self.tokenizer) + _PER_MESSAGE_TOKENS * len(prompt)
        counted = [self._image_tokens(u) for u in urls]
        if self.fixed_image_tokens is not None:
            rule = f"options.image_tokens = {self.fixed_image_tokens} per image"
        elif self.vision is not None:
            rule = self.vision.rule
        else:
            rule = "images not counted: set options.hf_model to the model's HF directory"
        return PromptCount(text, how, tuple(n for n, _ in counted), tuple(s for _, s in counted), rule if urls else "")

    def check(self, prompt: Sequence[Mapping[str, Any]] | str, max_tokens: int, max_model_len: int | None) -> None:
        """Raise :class:`PayloadTooLarge` when prompt + images + ``max_tokens`` exceed ``max_model_len``
        (declared or reported by the engine; else ``hf_model``'s ``max_position_embeddings``)."""
        self.load()
        limit_name = "the engine's max_model_len"
        if max_model_len is None and self.context_len is not None:
            max_model_len = self.context_len
            limit_name = "max_position_embeddings of options.hf_model (the engine reports no max_model_len)"
        if max_model_len is None:
            return
        c = self.count(prompt)
        need = c.total + max_tokens
        if need <= max_model_len:
            return
        images = ""
        if c.images:
            each = ", ".join(
                f"{n}" + (f" ({s[0]}x{s[1]})" if s else "") for n, s in zip(c.images, c.sizes, strict=True)
            )
            images = f" + {len(c.images)} image(s) {sum(c.images)} tokens [{each}; {c.image_rule}]"
        room = max_model_len - max_tokens - c.text
        rest = "lower options.max_tokens, or serve the model with a longer context (vLLM --max-model-len)"
        fix = f"send a shorter question or document, {rest}"
        if c.images and room > 0:
            fix = (
                f"send fewer or smaller images ({room} tokens are left for images after the text and max_tokens), "
                f"lower the processor's max_pixels at the engine, {rest}"
            )
        raise PayloadTooLarge(
            f"model {self.name!r}: prompt {c.text} text tokens ({c.how}){images} + max_tokens {max_tokens} = "
            f"{need}, above {limit_name} {max_model_len}",
            field="messages",
            fix=fix,
        )
