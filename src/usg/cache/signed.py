"""Signed cache values: a store shared with other writers (Redis) serves only what holders of a secret wrote.

The codec never runs stored code and rejects values that do not decode (a forged size, a record
without the ports the graph reads), but a well-formed value with wrong contents planted by anyone
who can write the Redis database would still be served as the node's result. With
``cache: {hmac_key_env: VAR}`` every value is written as ``USGH1`` + HMAC-SHA256(secret, key, value)
+ the value, and a value read back is served only when its tag verifies under the secret in ``$VAR``:
anything else (unsigned, another secret, a value moved to another key, a flipped byte) is a counted
miss with a warning, and the node computes. Replicas that share a store share the secret; a new
secret turns every old entry into a miss (rotation costs one recomputation per entry).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time

from usg.cache.store import CacheStore
from usg.errors import GraphError, GraphProblem

__all__ = ["MIN_SECRET_BYTES", "SignedStore", "read_secret"]

log = logging.getLogger("usg.cache")

MAGIC = b"USGH1"
_TAG = hashlib.sha256().digest_size
#: a shorter secret is refused: HMAC-SHA256 is as strong as its key, and a short one can be guessed
MIN_SECRET_BYTES = 16
_WARN_EVERY_S = 10.0  # a flood of rejected values (an attacker, a replica with another secret) logs one line per 10 s
_GENERATE = "generate one with: export {env}=$(openssl rand -hex 32) (the same value on every replica)"


def read_secret(env: str, where: str) -> bytes:
    """The secret in ``$env`` (raises :class:`GraphError` naming ``where`` when it is unset or short)."""
    value = os.environ.get(env)
    if not value:
        raise GraphError(
            [GraphProblem(where, f"hmac_key_env names {env!r}, which is not set", _GENERATE.format(env=env))]
        )
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise GraphError(
            [
                GraphProblem(
                    where,
                    f"${env} holds {len(secret)} bytes; a signing secret needs at least {MIN_SECRET_BYTES}",
                    _GENERATE.format(env=env),
                )
            ]
        )
    return secret


class SignedStore(CacheStore):
    """``inner`` with every value signed on write and verified on read (see the module's doc).
    Shares ``inner``'s counters; ``stats.rejected`` counts values whose tag did not verify."""

    def __init__(self, inner: CacheStore, secret: bytes, env: str) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.stats = inner.stats
        self.env = env
        self._secret = secret
        self._warned_at = -_WARN_EVERY_S
        self._unwarned = 0

    def _tag(self, key: str, data: bytes | memoryview) -> bytes:
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        mac.update(b"usg-cache\0" + key.encode() + b"\0")
        mac.update(data)
        return mac.digest()

    async def get(self, key: str) -> bytes | None:
        data = await self.inner.get(key)
        if data is None:
            return None
        head = len(MAGIC) + _TAG
        if len(data) >= head and data.startswith(MAGIC):
            value = memoryview(data)[head:]
            if hmac.compare_digest(self._tag(key, value), data[len(MAGIC) : head]):
                return bytes(value)
            why = "its signature does not verify (another secret, another key, or altered bytes)"
        else:
            why = "it is not signed"
        self.stats.rejected += 1
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY_S:
            self._unwarned += 1
            return None
        more = f" ({self._unwarned} more since the last warning)" if self._unwarned else ""
        self._warned_at, self._unwarned = now, 0
        log.warning(
            "cache: %s store: the value under key %s… was not served: %s; the node computes%s. "
            "If other writers share this store, give every one the same $%s",
            self.name,
            key[:16],
            why,
            more,
            self.env,
        )
        return None

    async def put(self, key: str, data: bytes) -> None:
        await self.inner.put(key, MAGIC + self._tag(key, data) + data)

    async def aclose(self) -> None:
        await self.inner.aclose()
