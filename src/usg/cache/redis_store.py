"""The Redis store (redis-py's asyncio client): shared by processes and replicas.

A Redis fault (refused, timed out, reset) is counted in ``stats.faults`` and logged as a
warning; the lookup is a miss and the write is skipped, so the node computes and the request
never fails. After a fault the store rests for ``retry_s`` before trying Redis again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from usg.cache.store import CacheStore
from usg.errors import UsageError

__all__ = ["RedisStore"]

log = logging.getLogger("usg.cache")
PREFIX = "usg:cache:"


def _client(url: str, timeout_s: float) -> Any:
    try:
        import redis.asyncio as aioredis
    except ImportError:
        raise UsageError(
            "cache backend 'redis' needs the redis client; fix: pip install 'usg[cache]' (or pip install redis)"
        ) from None
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


class RedisStore(CacheStore):
    name = "redis"

    def __init__(self, url: str, ttl_s: float | None = None, *, timeout_s: float = 0.5, retry_s: float = 1.0) -> None:
        super().__init__()
        self.url = url
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._timeout_s = timeout_s
        self._client: Any = None
        self._resting_until = 0.0

    def _redis(self) -> Any | None:
        if time.monotonic() < self._resting_until:
            return None
        if self._client is None:
            self._client = _client(self.url, self._timeout_s)
        return self._client

    def _fault(self, op: str, exc: BaseException) -> None:
        self.stats.faults += 1
        self._resting_until = time.monotonic() + self.retry_s
        log.warning(
            "cache: redis %s at %s failed (%s: %s); computing without the cache", op, self.url, type(exc).__name__, exc
        )

    async def get(self, key: str) -> bytes | None:
        try:
            client = self._redis()
            if client is None:
                return None
            data = await client.get(PREFIX + key)
        except UsageError:  # the redis client is not installed: say so, do not hide it as a fault
            raise
        except Exception as exc:  # any client fault (a URL it cannot use, too) is a miss, never a failed request
            self._fault("get", exc)
            return None
        return None if data is None else bytes(data)

    async def put(self, key: str, data: bytes) -> None:
        try:
            client = self._redis()
            if client is None:
                return
            ex = None if self.ttl_s is None else max(1, round(self.ttl_s * 1000))
            await client.set(PREFIX + key, data, px=ex)
        except UsageError:
            raise
        except Exception as exc:
            self._fault("set", exc)

    async def aclose(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception as exc:
                log.warning("cache: closing the redis client failed: %s", exc)
            self._client = None
