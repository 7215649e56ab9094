"""usg.plan exports a curated, sorted public API."""

from __future__ import annotations

import usg.plan


def test_all_is_sorted_and_resolvable() -> None:
    assert usg.plan.__all__ == sorted(usg.plan.__all__)
    for name in usg.plan.__all__:
        assert hasattr(usg.plan, name), name


def test_core_names_are_exported() -> None:
    for name in ("GPUProfile", "Plan", "Target", "get_gpu", "load_model_config", "plan"):
        assert name in usg.plan.__all__
