"""The graph's ``cache:`` settings: which nodes' results are kept, and where.

A graph-level ``cache:`` sets the store every cached node uses by default; a node opts in
with ``cache: true`` (or a mapping that overrides the graph's settings) and out with
``cache: false``::

    cache:                       # graph level (all keys optional)
      backend: memory            # memory (in-process LRU) | redis | off (no node is cached)
      max_bytes: 268435456       # memory: the LRU's bound in bytes (256 MiB)
      url: redis://127.0.0.1:6379/0   # redis
      ttl_s: 3600                # an entry's lifetime (none: until evicted)
      default: false             # true: every node without its own cache: key is cached
      hmac_key_env: USG_CACHE_KEY  # sign values with the secret in $USG_CACHE_KEY; serve only verified ones
    nodes:
      det: {model: det, inputs: {...}, cache: true}

Problems are collected as :class:`~usg.errors.GraphProblem` (field, value, fix).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from usg.errors import GraphProblem

__all__ = ["BACKENDS", "CacheSpec", "parse_cache", "resolve_node_cache"]

BACKENDS = ("memory", "redis", "off")
_KEYS = ("backend", "max_bytes", "url", "ttl_s", "default", "hmac_key_env")
_NODE_KEYS = ("backend", "max_bytes", "url", "ttl_s", "hmac_key_env")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class CacheSpec:
    """Where a node's results are kept. ``default`` only matters at graph level."""

    backend: str = "memory"
    max_bytes: int = 256 * 1024 * 1024
    url: str | None = None
    ttl_s: float | None = None
    default: bool = False
    hmac_key_env: str | None = None  # the variable holding the signing secret (usg.cache.signed)
    hmac_key_where: str = dataclasses.field(default="cache.hmac_key_env", compare=False)  # the field that set it

    @property
    def store_key(self) -> tuple[Any, ...]:
        """Nodes whose specs share this key share one store."""
        return (self.backend, self.max_bytes, self.url, self.ttl_s, self.hmac_key_env)


def _check(where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> tuple[dict[str, Any], list[GraphProblem]]:
    problems: list[GraphProblem] = []
    given: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                GraphProblem(f"{where}.{key}", f"unknown cache key {key!r}", f"{hint}use one of: {', '.join(allowed)}")
            )
            continue
        problem = _value_problem(f"{where}.{key}", str(key), value)
        if problem is not None:
            problems.append(problem)
        else:
            given[str(key)] = value
    backend = given.get("backend", "memory")
    if backend == "redis" and "url" not in given and where == "cache":
        given["url"] = "redis://127.0.0.1:6379/0"
    return given, problems


def _value_problem(where: str, key: str, value: Any) -> GraphProblem | None:
    if key == "backend" and value not in BACKENDS:
        close = difflib.get_close_matches(str(value), BACKENDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return GraphProblem(where, f"unknown cache backend {value!r}", f"{hint}use one of: {', '.join(BACKENDS)}")
    if key == "max_bytes" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return GraphProblem(where, f"max_bytes is {value!r}", "use a positive integer of bytes such as 268435456")
    if (
        key == "ttl_s"
        and value is not None
        and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0)
    ):
        return GraphProblem(where, f"ttl_s is {value!r}", "use a positive number of seconds, or leave it out")
    if key == "url" and (not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://"))):
        return GraphProblem(
            where, f"url is {value!r}", "write url: redis://HOST:PORT/DB, e.g. redis://127.0.0.1:6379/0"
        )
    if key == "url" and value.startswith(("redis://", "rediss://")):
        try:
            urllib.parse.urlsplit(value).port  # noqa: B018 - reading .port checks it (redis-py would fail per request)
        except ValueError as exc:
            return GraphProblem(
                where, f"url {value!r} does not parse ({exc})", "write url: redis://HOST:PORT/DB with a port in 1-65535"
            )
    if key == "hmac_key_env" and (not isinstance(value, str) or not _ENV_NAME.match(value)):
        return GraphProblem(
            where,
            f"hmac_key_env is {value!r}, not an environment variable's name",
            "write hmac_key_env: USG_CACHE_KEY (the name of the variable that holds the secret, not the secret)",
        )
    if key == "default" and not isinstance(value, bool):
        return GraphProblem(where, f"default is {value!r}", "write default: true or default: false")
    return None


def parse_cache(value: Any, where: str = "cache") -> tuple[CacheSpec | None, list[GraphProblem]]:
    """The graph-level spec of a ``cache:`` mapping (None: absent) and the problems found in it."""
    if value is None:
        return None, []
    if not isinstance(value, Mapping):
        fix = (
            "write cache: {backend: memory|redis|off, max_bytes: N, url: redis://..., ttl_s: S, default: false, "
            "hmac_key_env: VAR}"
        )
        return None, [GraphProblem(where, f"expected a mapping, got {type(value).__name__} {value!r}", fix)]
    given, problems = _check(where, value, _KEYS)
    return CacheSpec(**given), problems


def resolve_node_cache(
    node: str, value: Any, graph_spec: CacheSpec | None
) -> tuple[CacheSpec | None, list[GraphProblem]]:
    """A node's effective spec from its ``cache:`` value (None when the node is not cached)."""
    where = f"nodes.{node}.cache"
    base = graph_spec or CacheSpec()
    if value is None:
        spec = base if graph_spec is not None and graph_spec.default else None
        problems: list[GraphProblem] = []
    elif value is False:
        spec, problems = None, []
    elif value is True:
        spec, problems = base, []
    elif isinstance(value, Mapping):
        given, problems = _check(where, value, _NODE_KEYS)
        if given.get("backend") == "redis" and "url" not in given:
            given["url"] = base.url or "redis://127.0.0.1:6379/0"
        if "hmac_key_env" in given:
            given["hmac_key_where"] = f"{where}.hmac_key_env"
        spec = dataclasses.replace(base, **given)
    else:
        fix = "write cache: true, cache: false, or cache: {backend: memory|redis, ...}"
        return None, [GraphProblem(where, f"cache is {value!r}", fix)]
    if spec is not None and (spec.backend == "off" or (graph_spec is not None and graph_spec.backend == "off")):
        spec = None
    return spec, problems
