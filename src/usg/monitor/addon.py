"""What ``usg serve`` plugs into its app: observers that also bind to the server, add routes and close.

``create_app(graph, addons=[...])`` adds each addon to the executor's observers, calls ``note_raw``
with each request's encoded inputs, ``bind`` after start-up, ``close`` after shutdown, and mounts
``routes()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from usg.graph.model import Graph
from usg.runtime.observer import Observer

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

__all__ = ["ServeAddon", "serve_addons"]


class ServeAddon(Observer):
    """Base addon: every method is a no-op."""

    def note_raw(self, request_id: str, raw: Mapping[str, Any]) -> None:
        return None

    def bind(self, ctx: Any) -> None:
        """``ctx``: the server's ``usg.serve.app.ServeContext`` (not imported here: serve imports this module)."""
        return None

    def routes(self) -> list[BaseRoute]:
        return []

    def close(self) -> None:
        return None


def serve_addons(
    graph: Graph, *, reference: str | Path | None = None, trace_file: str | Path | None = None, batching: bool = True
) -> list[ServeAddon]:
    """The addons of ``usg serve --reference REF --trace-file PATH`` (each optional)."""
    addons: list[ServeAddon] = []
    if reference is not None:
        from usg.monitor.live import LiveMonitor
        from usg.monitor.profile import load_profile

        addons.append(LiveMonitor(graph, load_profile(reference)))
    if trace_file is not None:
        from usg.monitor.tracefile import TraceFileWriter

        addons.append(TraceFileWriter(trace_file, graph, batching=batching))
    return addons
