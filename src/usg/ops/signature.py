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
    #: a cheap op (no I/O, tens of microseconds): True, or given a call's inputs whether that call
    #: is cheap (e.g. building a text-only prompt); the executor then calls it on the event loop
    inline: bool | Callable[[Mapping[str, Any]], bool] = False
    # input port -> "module:function" the op reads each value of that port through (the op accepts
    # either the value or the function's result): an engine may apply it where the value is made
    reducers: dict[str, str] = field(default_factory=dict)


F = TypeVar("F", bound=Callable[..., Any])


def op(
    *,
    inputs: Mapping[str, PortSpec] | None = None,
    outputs: Mapping[str, PortSpec] | None = None,
    inline: bool | Callable[[Mapping[str, Any]], bool] = False,
    reducers: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Attach port contracts to a node function.

    The function is called with its input ports as keyword arguments (plus the node's
    ``options``) and returns a dict with exactly the declared output ports. ``inline``: the op is
    cheap (no I/O, tens of microseconds, such as a streaming op run per audio chunk) — True, or a
    function of the call's inputs deciding per call (e.g. a prompt without an image); the
    executor then calls it on its event loop instead of handing it to a worker thread.
    ``reducers`` names, per input port, a function the op reads each item of that port through
    (see :mod:`usg.ops.wire`); the op must accept the item or the function's result.
    """

    def deco(func: F) -> F:
        sig = OpSignature(dict(inputs or {}), dict(outputs or {}), inline=inline, reducers=dict(reducers or {}))
        func.__usg_op__ = sig  # type: ignore[attr-defined]
        return func

    return deco


def signature_of(func: Callable[..., Any]) -> OpSignature | None:
    sig = getattr(func, "__usg_op__", None)
    return sig if isinstance(sig, OpSignature) else None
