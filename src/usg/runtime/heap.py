"""The start-up heap, moved out of the garbage collector's way once a server has started.

A served graph allocates its long-lived objects at start-up — modules, the graph, the models'
sessions, tokenizers, metric families: ~40,000 tracked objects for the speech-stream example.
CPython's full (generation-2) collection walks all of them each time it runs, which under a
steady stream of requests is about once a second: 30–60 ms with the event loop stopped, every
session's chunk waiting behind it (the p95 of 128 real-time VAD streams was 40 ms with it, 16 ms
without; benchmarks/README.md, "Streaming VAD"). :func:`freeze_startup_heap` collects once and
then moves every object alive into the permanent generation (:func:`gc.freeze`), which full
collections skip. Frozen objects are still freed by reference counting when the last reference
goes; only a reference cycle among them would be kept, so it runs once, after start-up, in a
process that serves one graph for its lifetime (``usg serve``), not in library code that builds
executors over and over.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["freeze_startup_heap"]

log = logging.getLogger("usg.runtime")  # usg serve: uvicorn's logger prints it (start-up lines)


def freeze_startup_heap(logger: logging.Logger | None = None) -> int:
    """Collect garbage, then freeze every object alive; returns how many are frozen in all."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    (logger or log).info("start-up heap frozen: %d objects out of the garbage collector's full passes", frozen)
    return frozen
