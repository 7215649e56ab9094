"""The executor's node-cache step: look cached nodes up before a request runs, store after.

Per request (:meth:`NodeCache.begin`): every active node gets its content address
(:func:`usg.cache.key.node_keys`); each cached node's key is either *led* by this request
(nobody else is computing it: look it up in the store) or *followed* (an identical request
is computing it right now: wait for that result — single flight). Hits fill the node's
outputs; nodes whose every consumer is a hit (or itself not needed) are not run at all.
After a led node ran, :meth:`NodeCache.store` writes its outputs and hands them to the
followers; :meth:`NodeCache.finish` releases whatever a failed request still led, so a
follower then computes the node itself. A cache fault never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from usg.cache.codec import CodecError, decode, encode
from usg.cache.key import file_digest, node_identity, node_keys
from usg.cache.memory import MemoryStore
from usg.cache.signed import SignedStore, read_secret
from usg.cache.store import CacheStore
from usg.graph.cache import CacheSpec
from usg.graph.model import OUT_ALIAS, Graph
from usg.records import CacheEvent

__all__ = ["CacheBegin", "NodeCache", "NodeCacheStats", "make_store"]

log = logging.getLogger("usg.cache")


def make_store(spec: CacheSpec) -> CacheStore:
    """The store a spec names; with ``hmac_key_env`` it signs and verifies every value (the
    secret is read now: unset or short, a :class:`~usg.errors.GraphError` naming the field)."""
    store: CacheStore
    if spec.backend == "redis":
        from usg.cache.redis_store import RedisStore

        store = RedisStore(spec.url or "redis://127.0.0.1:6379/0", spec.ttl_s)
    else:
        store = MemoryStore(spec.max_bytes, spec.ttl_s)
    if spec.hmac_key_env:
        store = SignedStore(store, read_secret(spec.hmac_key_env, spec.hmac_key_where), spec.hmac_key_env)
    return store


@dataclass
class NodeCacheStats:
    """Counters of one cached node; ``errors`` counts values that did not decode and store faults."""

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    stores: int = 0
    errors: int = 0
    uncacheable: int = 0
    hit_ms: deque[float] = field(default_factory=lambda: deque(maxlen=4096))


@dataclass
class CacheBegin:
    """What the cache decided for one request: keys, served outputs, nodes not to run."""

    keys: dict[str, str]
    hits: dict[str, dict[str, Any]]
    skip: set[str]
    led: dict[str, str] = field(default_factory=dict)  # node -> key this request computes for others


_MISS = object()


class NodeCache:
    """The cache of one executor: stores by spec, node identities, in-flight keys, stats."""

    def __init__(
        self,
        graph: Graph,
        emit: Callable[[CacheEvent], None],
        empty: Callable[[], dict[str, Any]],
        stores: Mapping[tuple[Any, ...], CacheStore] | None = None,
    ) -> None:
        self.graph = graph
        self._emit = emit
        self._empty = empty
        self.cached = {n: d.cache for n, d in graph.nodes.items() if d.cache is not None}
        self.stores: dict[tuple[Any, ...], CacheStore] = dict(stores or {})
        for spec in self.cached.values():
            if spec.store_key not in self.stores:
                self.stores[spec.store_key] = make_store(spec)
        self.stats = {n: NodeCacheStats() for n in self.cached}
        refs = [*(r for d in graph.nodes.values() for r in d.inputs.values()), *graph.outputs.values()]
        #: the ports of each cached node that other nodes or the graph's outputs read: a stored value must hold them
        self.read_ports = {n: {r.port for r in refs if r.source == n} for n in self.cached}
        self.identities: dict[str, str] = {}
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.cached)

    def prepare(self) -> None:
        """Hash each model file once and every node's identity (blocking: run it in a worker)."""
        digests = {
            n: file_digest(m.path) for n, m in self.graph.models.items() if m.path is not None and m.path.exists()
        }
        own = {n: node_identity(self.graph, d, digests) for n, d in self.graph.nodes.items()}
        for name in self.graph.order:  # upstream identities: a node's identity covers its ancestors'
            ups = sorted(self.graph.upstream(name))
            self.identities[name] = own[name] + "".join(f"|{u}:{self.identities[u]}" for u in ups)

    def _store(self, node: str) -> CacheStore:
        return self.stores[self.cached[node].store_key]

    def _event(self, node: str, outcome: str, seconds: float, nbytes: int = 0) -> None:
        st = self._store(node)
        self._emit(CacheEvent(node, st.name, outcome, seconds, nbytes, st.stats.bytes_held, st.stats.evictions))

    async def begin(self, active: Sequence[str], digests: Mapping[str, str]) -> CacheBegin:
        keys = node_keys(self.graph, self.identities, digests, list(active))
        plan = CacheBegin(keys, {}, set())
        followed: dict[str, asyncio.Future[Any]] = {}
        loop = asyncio.get_running_loop()
        for name in active:  # no await in this loop: claiming keys is atomic per request
            if name not in self.cached:
                continue
            fut = self._inflight.get(keys[name])
            if fut is not None:
                followed[name] = fut
            else:
                self._inflight[keys[name]] = loop.create_future()
                plan.led[name] = keys[name]
        try:
            led = list(plan.led)
            found = await asyncio.gather(*(self._lookup(n, keys[n]) for n in led))
            raw: dict[str, bytes] = {}
            for name, (value, data) in zip(led, found, strict=True):
                if value is not _MISS:
                    plan.hits[name], raw[name] = value, data
            for name, fut in followed.items():
                t0 = time.perf_counter()
                value = await asyncio.shield(fut)
                if value is not _MISS:
                    value = self._decode(name, keys[name], value)
                if value is _MISS:
                    self.stats[name].misses += 1
                    self._event(name, "miss", time.perf_counter() - t0)
                else:
                    self.stats[name].coalesced += 1
                    self._event(name, "coalesced", time.perf_counter() - t0)
                    plan.hits[name] = value
            plan.skip = self._not_needed(active, plan.hits)
            for name in [n for n in plan.led if n in plan.hits or n in plan.skip]:
                self._release(plan, name, raw.get(name))  # a hit goes to the followers as well
        except BaseException:  # cancelled or failed while looking up: release what this request claimed
            self.finish(plan)
            raise
        return plan

    async def _lookup(self, name: str, key: str) -> tuple[Any, bytes]:
        store = self._store(name)
        t0 = time.perf_counter()
        faults = store.stats.faults + store.stats.rejected
        data = await store.get(key)
        value = _MISS if data is None else self._decode(name, key, data)
        dt = time.perf_counter() - t0
        if store.stats.faults + store.stats.rejected != faults:
            self.stats[name].errors += 1
            self._event(name, "error", dt)
        if value is _MISS:
            self.stats[name].misses += 1
            self._event(name, "miss", dt)
        else:
            self.stats[name].hits += 1
            self.stats[name].hit_ms.append(dt * 1e3)
            self._event(name, "hit", dt, len(data or b""))
        return value, data or b""

    def _decode(self, name: str, key: str, data: bytes) -> Any:
        try:
            record = decode(key, data)
            if not isinstance(record, dict) or not isinstance(record.get("outputs"), dict):
                raise CodecError(f"a {type(record).__name__} where a node record (with an outputs dict) belongs")
            outputs = dict(record["outputs"])
            if record.get("empty"):
                return self._empty()
            if record.get("alias") is not None:
                outputs[OUT_ALIAS] = outputs[record["alias"]]
            missing = self.read_ports[name].difference(outputs)
            if missing:  # served, it would drop an output or fail a consumer: a wrong answer
                raise CodecError(
                    f"the stored outputs ({', '.join(map(str, outputs)) or 'none'}) lack the port(s) "
                    f"{', '.join(sorted(missing))} the graph reads"
                )
            return outputs
        except Exception as exc:  # whatever a store holds, a value that does not decode is a miss, never a failure
            self.stats[name].errors += 1
            log.warning("cache: node %r: a stored value did not decode (%s); computing it", name, exc)
            self._event(name, "error", 0.0)
            return _MISS

    def _not_needed(self, active: Sequence[str], hits: Mapping[str, Any]) -> set[str]:
        """Hits, and nodes whose every consumer is a hit or not needed (never an output's source)."""
        sources = {r.source for r in self.graph.outputs.values()}
        act = set(active)
        skip = set(hits)
        for name in reversed(list(active)):
            if name in skip or name in sources:
                continue
            consumers = [c for c in self.graph.consumers(name) if c in act]
            if consumers and all(c in skip for c in consumers):
                skip.add(name)
        return skip

    def _release(self, plan: CacheBegin, name: str, data: bytes | None) -> None:
        key = plan.led.pop(name, None)
        if key is None:
            return
        fut = self._inflight.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(_MISS if data is None else data)

    async def store(self, plan: CacheBegin, name: str, outputs: dict[str, Any] | None) -> None:
        """After ``name`` ran: write its outputs and hand them to requests waiting for them."""
        if name not in self.cached:
            return
        data = None
        t0 = time.perf_counter()
        if outputs is not None:
            try:
                data = encode(plan.keys[name], _record(outputs))
            except CodecError as exc:
                self.stats[name].uncacheable += 1
                log.debug("cache: node %r output is not cacheable: %s", name, exc)
        self._release(plan, name, data)
        if data is None:
            return
        store = self._store(name)
        faults = store.stats.faults
        await store.put(plan.keys[name], data)
        self.stats[name].stores += 1
        if store.stats.faults != faults:
            self.stats[name].errors += 1
            self._event(name, "error", time.perf_counter() - t0)
        self._event(name, "store", time.perf_counter() - t0, len(data))

    def finish(self, plan: CacheBegin) -> None:
        """Release every key a request still leads (it failed or was cancelled)."""
        for name in list(plan.led):
            self._release(plan, name, None)

    async def aclose(self) -> None:
        for store in self.stores.values():
            await store.aclose()


def _record(outputs: dict[str, Any]) -> dict[str, Any]:
    if type(outputs) is not dict:  # the executor's empty fan-out: every port an empty list
        return {"outputs": {}, "empty": True}
    alias = None
    if OUT_ALIAS in outputs:
        alias = next(
            (k for k, v in outputs.items() if k != OUT_ALIAS and _same(v, outputs[OUT_ALIAS])),
            None,
        )
    kept = {k: v for k, v in outputs.items() if alias is None or k != OUT_ALIAS}
    return {"outputs": kept, "alias": alias}


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b)
        and all(x is y for x, y in zip(a, b, strict=True))
    )
