"""Hugging Face ``tokenizers`` backend: text in, ``input_ids`` / ``attention_mask`` / ``token_type_ids`` out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from usg.backends.base import Backend, BackendState
from usg.errors import InputError
from usg.specs import TensorSpec

__all__ = ["TOKENIZER_INPUTS", "TOKENIZER_OUTPUTS", "TokenizerBackend"]

_SEQ = TensorSpec("int64", ("batch", "seq"))
TOKENIZER_INPUTS = {"text": TensorSpec("str", ("batch",))}
TOKENIZER_OUTPUTS = {"input_ids": _SEQ, "attention_mask": _SEQ, "token_type_ids": _SEQ}


class TokenizerBackend(Backend):
    """Tokenizes a batch of strings with a ``tokenizer.json``.

    Options: ``max_length`` (truncate to this many tokens, default 512),
    ``pad_to_multiple`` (pad a batch's sequences to a multiple, default 1).
    Input ``text``: a list of strings (one per batch item). Outputs are int64
    ``[batch, seq]``, padded to the longest item of the batch with the pad id.
    """

    kind = "tokenizer"
    inline = True  # a Rust tokenizer on one short text takes microseconds
    # encode_batch is thread-safe and releases the GIL: a long text in one worker thread does not
    # hold up the short texts of other requests (each text is bounded by limits.max_text_chars)
    default_concurrency = 4

    def runs_inline(self, inputs: Mapping[str, Any]) -> bool:
        # long documents take milliseconds: those go to a worker thread, off the event loop
        texts = inputs.get("text", ())
        return sum(len(t) for t in texts if isinstance(t, str)) <= 20_000

    def __init__(self, path: Path, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__()
        self.path = Path(path)
        self.name = name or self.path.stem
        opts = dict(options or {})
        self.max_length = int(opts.get("max_length", 512))
        self.pad_to_multiple = int(opts.get("pad_to_multiple", 1))
        self._tok: Any = None

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]:
        return TOKENIZER_INPUTS

    @property
    def output_specs(self) -> Mapping[str, TensorSpec]:
        return TOKENIZER_OUTPUTS

    def load(self) -> None:
        if self._tok is not None:
            return
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.path))
        tok.enable_truncation(max_length=self.max_length)
        tok.no_padding()
        self._tok = tok
        self.state = BackendState.LOADED

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if self._tok is None:
            self.load()
        texts = inputs["text"]
        if isinstance(texts, np.ndarray):
            texts = texts.tolist()
        if isinstance(texts, str):
            texts = [texts]
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(
                    f"tokenizer {self.name!r}: item {i} is {type(t).__name__}, not str",
                    field="text",
                    fix="pass text as a string",
                )
        encs = self._tok.encode_batch(list(texts))
        longest = max((len(e.ids) for e in encs), default=0)
        m = self.pad_to_multiple
        width = max(1, -(-longest // m) * m)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        pad_id = self._pad_id()
        ids[:] = pad_id
        for row, enc in enumerate(encs):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def _pad_id(self) -> int:
        pad = self._tok.padding
        if pad and pad.get("pad_id") is not None:
            return int(pad["pad_id"])
        for token in ("[PAD]", "<pad>", "<|pad|>"):
            tid = self._tok.token_to_id(token)
            if tid is not None:
                return int(tid)
        return 0
