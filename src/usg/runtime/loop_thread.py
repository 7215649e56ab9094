"""An asyncio event loop in a background thread, so blocking code can call coroutines.

The executor's sync facade (``Executor.infer_sync``, ``with Executor(...)``) runs its
coroutines here: scripts and the CLI call it from plain threads, several at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """Starts its loop (a daemon thread) on the first :meth:`run`; :meth:`stop` ends it."""

    def __init__(self, name: str = "usg-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._loop is not None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    ready.set()
                    loop.run_forever()

                self._thread = threading.Thread(target=main, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it returns (or raises)."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure()).result()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop and its thread (waiting up to ``timeout_s``); idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=timeout_s)
        loop.close()
