"""The store seam: an async get/put of bytes by key, and the counters every store keeps."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheStore", "StoreStats"]


@dataclass
class StoreStats:
    """What a store did: evictions (memory LRU), bytes and entries held, faults (an unreachable
    Redis: each one is a miss or a skipped write, never a failed request) and rejected values
    (a signed store's values whose signature did not verify: each one a miss)."""

    evictions: int = 0
    bytes_held: int = 0
    entries: int = 0
    faults: int = 0
    rejected: int = 0


class CacheStore:
    """Base store. ``get`` returns None on a miss; a store fault is counted, never raised."""

    name = "base"

    def __init__(self) -> None:
        self.stats = StoreStats()

    async def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    async def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None
