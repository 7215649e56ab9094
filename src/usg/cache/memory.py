"""The in-process store: an LRU of encoded values bounded in bytes, with an optional TTL."""

from __future__ import annotations

import time
from collections import OrderedDict

from usg.cache.store import CacheStore

__all__ = ["MemoryStore"]


class MemoryStore(CacheStore):
    """Keeps at most ``max_bytes`` of values; the least recently used go first. A value larger
    than the bound is not kept. ``ttl_s``: entries older than that are misses."""

    name = "memory"

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, ttl_s: float | None = None) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, tuple[bytes, float]] = OrderedDict()

    def get_now(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        data, expires = item
        if expires and time.monotonic() >= expires:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return data

    def put_now(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        if key in self._items:
            self._drop(key)
        expires = time.monotonic() + self.ttl_s if self.ttl_s else 0.0
        self._items[key] = (data, expires)
        self.stats.bytes_held += len(data)
        while self.stats.bytes_held > self.max_bytes:
            oldest = next(iter(self._items))
            self._drop(oldest)
            self.stats.evictions += 1
        self.stats.entries = len(self._items)

    def _drop(self, key: str) -> None:
        data, _ = self._items.pop(key)
        self.stats.bytes_held -= len(data)
        self.stats.entries = len(self._items)

    async def get(self, key: str) -> bytes | None:
        return self.get_now(key)

    async def put(self, key: str, data: bytes) -> None:
        self.put_now(key, data)
