"""The backend seam: what the executor needs from anything that runs a model.

A backend runs one *batch* per :meth:`Backend.infer` call, in a worker thread.
Inputs and outputs are dicts of arrays whose axis 0 is the batch axis (for
tokenizers, lists of strings in). Backends are created from their kind, file and
options by :func:`usg.backends.create_backend`.
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Callable, Mapping
from typing import Any

from usg.records import BatchEvent, ItemTiming
from usg.specs import TensorSpec

__all__ = ["Backend", "BackendState", "DeclaredSpecsBackend", "DelegatingBackend"]


class BackendState(enum.StrEnum):
    NEW = "new"
    LOADED = "loaded"
    CLOSED = "closed"


class Backend(abc.ABC):
    """A model runtime: load once, infer many batches, close."""

    #: the backend kind as written in a graph file (``onnxruntime``, ``tokenizer``, ...)
    kind: str = "abstract"
    #: True for backends so cheap (microseconds per item) that a worker-thread hop costs more
    #: than the call: the runner calls them on the event loop
    inline: bool = False
    #: True for backends whose model runs elsewhere (a Ray Serve deployment, a Triton server):
    #: the runner awaits :meth:`ainfer` on the event loop, with no worker thread and no local
    #: concurrency cap (the remote side queues and batches)
    remote: bool = False
    #: True for remote backends that send a :func:`usg.ops.wire.derived` value as its function
    #: and source and compute it on the far side (the Ray engine): the value is never read here,
    #: so the executor may defer it (:mod:`usg.runtime.deferral`); a Triton BLS call sends the
    #: tensor itself
    ships_derived: bool = False
    #: True for remote backends whose far side batches calls and reports each batch it ran
    #: (a :class:`usg.records.BatchEvent`) to :attr:`batch_listeners`; the executor
    #: adds its observers there, so metrics see remote batches as they see local ones
    remote_batching: bool = False
    #: calls that may run at once when the graph does not say (``options.concurrency``): a
    #: backend whose library is thread-safe and releases the GIL allows several in flight
    default_concurrency: int = 1
    #: True when a call's whole CPU work runs in the calling thread (a single-threaded CPU
    #: session): the thread's CPU time is then the call's cost, untouched by other processes
    #: sharing the cores, and the batch controller weighs batch sizes by it (else by wall time)
    cpu_in_caller: bool = False

    async def ainfer(self, inputs: Mapping[str, Any], timing: ItemTiming | None = None) -> dict[str, Any]:
        """Run one item without blocking the event loop: remote backends override this (a backend
        that knows where the time went on the far side fills ``timing``: queue + transit, and
        compute); the default runs :meth:`infer` in a worker thread."""
        return await asyncio.to_thread(self.infer, inputs)

    async def astream(
        self, inputs: Mapping[str, Any], on_token: Callable[[str], None], timing: ItemTiming | None = None
    ) -> dict[str, Any]:
        """:meth:`ainfer`, calling ``on_token`` with each piece of text as the model generates it
        (a generation engine's backend overrides this); the default generates nothing to stream."""
        return await self.ainfer(inputs, timing)

    def runs_inline(self, inputs: Mapping[str, Any]) -> bool:
        """Whether this call is cheap enough to run on the event loop (see :attr:`inline`)."""
        return self.inline

    def __init__(self) -> None:
        self.state = BackendState.NEW
        self.batch_listeners: list[Callable[[BatchEvent], None]] = []

    @property
    @abc.abstractmethod
    def input_specs(self) -> Mapping[str, TensorSpec]:
        """Contracts of the inputs, axis 0 being the batch axis."""

    @property
    @abc.abstractmethod
    def output_specs(self) -> Mapping[str, TensorSpec]:
        """Contracts of the outputs, axis 0 being the batch axis."""

    def load(self) -> None:
        """Acquire resources (sessions, files). Idempotent."""
        self.state = BackendState.LOADED

    @abc.abstractmethod
    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run one batch. Called from a worker thread; must not keep references to inputs."""

    def close(self) -> None:
        self.state = BackendState.CLOSED

    async def aclose(self) -> None:
        """Close from the event loop (a backend holding async connections overrides this)."""
        self.close()

    @property
    def metadata(self) -> Mapping[str, str]:
        """Free-form metadata the model file carries (e.g. a vocabulary)."""
        return {}

    @property
    def description(self) -> str:
        return self.kind


class DelegatingBackend(Backend):
    """Wraps another backend and forwards everything to it; subclasses override what they add
    (recording the items it is given, leaving ``close`` to the inner backend's owner, ...)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__()
        self.inner, self.kind, self.inline = inner, inner.kind, inner.inline

    def runs_inline(self, inputs: Mapping[str, Any]) -> bool:
        return self.inner.runs_inline(inputs)

    @property
    def cpu_in_caller(self) -> bool:  # type: ignore[override]  # read from the wrapped backend
        return self.inner.cpu_in_caller

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]:
        return self.inner.input_specs

    @property
    def output_specs(self) -> Mapping[str, TensorSpec]:
        return self.inner.output_specs

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.inner.metadata

    @property
    def description(self) -> str:
        return self.inner.description

    def load(self) -> None:
        self.inner.load()
        self.state = self.inner.state

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return self.inner.infer(inputs)

    def close(self) -> None:
        self.inner.close()
        self.state = self.inner.state


class DeclaredSpecsBackend(Backend):
    """A backend whose contracts are given to it (or set by :meth:`load`) rather than read from a file."""

    def __init__(
        self, input_specs: Mapping[str, TensorSpec] | None = None, output_specs: Mapping[str, TensorSpec] | None = None
    ) -> None:
        super().__init__()
        self._in: dict[str, TensorSpec] = dict(input_specs or {})
        self._out: dict[str, TensorSpec] = dict(output_specs or {})

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]:
        return self._in

    @property
    def output_specs(self) -> Mapping[str, TensorSpec]:
        return self._out
