"""Content-addressed node cache (in-process LRU or Redis, no pickle) and input integrity digests.

See :mod:`usg.graph.cache` for the ``cache:`` section of a graph, :mod:`usg.cache.key` for
how keys are made, and :mod:`usg.cache.node_cache` for the executor step.
"""

from __future__ import annotations

from usg.cache.codec import CodecError, decode, encode
from usg.cache.integrity import check_expected, digest_inputs
from usg.cache.memory import MemoryStore
from usg.cache.node_cache import NodeCache, NodeCacheStats
from usg.cache.store import CacheStore, StoreStats

__all__ = [
    "CacheStore",
    "CodecError",
    "MemoryStore",
    "NodeCache",
    "NodeCacheStats",
    "StoreStats",
    "check_expected",
    "decode",
    "digest_inputs",
    "encode",
]
