"""Declare a node function's ports and contracts with :func:`op`, so graphs can check edges at build time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from usg.specs import TensorSpec

__all__ = ["ListOf", "OpSignature", "op", "signature_of"]


@dataclass(frozen=True)
class ListOf:
    """A port carrying a list (fan-out); ``item`` is the contract of each element, if known."""

    item: TensorSpec | None = None


PortSpec = TensorSpec | ListOf | None


@dataclass(frozen=True)
class OpSignature:
    inputs: dict[str, PortSpec] = field(default_factory=dict)
    outputs: dict[str, PortSpec] = field(default_factory=dict)


F = TypeVar("F", bound=Callable[..., Any])


def op(
    *, inputs: Mapping[str, PortSpec] | None = None, outputs: Mapping[str, PortSpec] | None = None
) -> Callable[[F], F]:
    """Attach port contracts to a node function.

    The function is called with its input ports as keyword arguments (plus the node's
    ``options``) and returns a dict with exactly the declared output ports.
    """

    def deco(func: F) -> F:
        func.__usg_op__ = OpSignature(dict(inputs or {}), dict(outputs or {}))  # type: ignore[attr-defined]
        return func

    return deco


def signature_of(func: Callable[..., Any]) -> OpSignature | None:
    sig = getattr(func, "__usg_op__", None)
    return sig if isinstance(sig, OpSignature) else None
