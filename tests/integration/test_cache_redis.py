"""The node cache on a real Redis (Debian's redis-server on a free 127.0.0.1 port): hits shared
by executors and processes, TTL, a replaced model file, and Redis down (never a failed request)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("redis")
from procs import free_port
from redis_proc import RedisServer

from usg.graph import load_graph
from usg.runtime import Executor

RESOURCES = Path(__file__).resolve().parents[1] / "resources"


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    yield server
    server.stop()


def write_graph(tmp_path: Path, url: str, *, ttl_s: float | None = None) -> Path:
    model = tmp_path / "weights.bin"
    if not model.exists():
        model.write_bytes(b"weights v1")
    ttl = f", ttl_s: {ttl_s}" if ttl_s else ""
    path = tmp_path / "graph.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: cached
            inputs: {{text: {{modality: text}}}}
            cache: {{backend: redis, url: "{url}"{ttl}}}
            models:
              m: {{backend: python, path: {model}, options: {{callable: "testops:doubled"}}}}
            nodes:
              up:  {{fn: "testops:upper", inputs: {{text: inputs.text}}, cache: true}}
              len: {{fn: "testops:length", inputs: {{text: up.text}}}}
              emb: {{model: m, inputs: {{x: len.n}}, cache: true}}
            outputs: {{upper: up.text, y: emb.y}}
            """
        )
    )
    return path


def run_once(path: Path, text: str) -> tuple[dict, dict]:
    with Executor(load_graph(path)) as ex:
        r = ex.infer_sync({"text": text})
        stats = {n: (s.hits, s.misses, s.errors) for n, s in ex.cache.stats.items()}
    return r.to_json_dict()["outputs"], stats


def test_two_executors_share_hits_through_redis(redis_server, tmp_path):
    path = write_graph(tmp_path, redis_server.url)
    out1, stats1 = run_once(path, "hello")
    out2, stats2 = run_once(path, "hello")
    assert out1 == out2 == {"upper": "HELLO", "y": [[10.0]]}
    assert stats1 == {"up": (0, 1, 0), "emb": (0, 1, 0)}
    assert stats2 == {"up": (1, 0, 0), "emb": (1, 0, 0)}


@pytest.mark.slow
def test_another_process_gets_hits_from_what_this_one_stored(redis_server, tmp_path):
    path = write_graph(tmp_path, redis_server.url)
    run_once(path, "shared")
    script = textwrap.dedent(
        f"""\
        import json, sys
        sys.path.insert(0, {str(RESOURCES)!r})
        from usg.graph import load_graph
        from usg.runtime import Executor
        with Executor(load_graph({str(path)!r})) as ex:
            r = ex.infer_sync({{"text": "shared"}})
            print(json.dumps({{n: s.hits for n, s in ex.cache.stats.items()}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == '{"up": 1, "emb": 1}'


def test_entries_expire_after_ttl(redis_server, tmp_path):
    path = write_graph(tmp_path, redis_server.url, ttl_s=2)
    with Executor(load_graph(path)) as ex:
        ex.infer_sync({"text": "ttl"})
        ex.infer_sync({"text": "ttl"})
        assert ex.cache.stats["emb"].hits == 1
        time.sleep(2.5)
        ex.infer_sync({"text": "ttl"})
        assert (ex.cache.stats["emb"].hits, ex.cache.stats["emb"].misses) == (1, 2)


def test_a_replaced_model_file_is_a_miss_though_redis_holds_the_old_value(redis_server, tmp_path):
    path = write_graph(tmp_path, redis_server.url)
    run_once(path, "model")
    (tmp_path / "weights.bin").write_bytes(b"weights v2 -- retrained")
    _, stats = run_once(path, "model")
    assert stats["emb"] == (0, 1, 0)  # another model digest: never served
    assert stats["up"] == (1, 0, 0)  # the fn node does not depend on the model file


def test_redis_down_the_node_computes_and_a_warning_counter_rises(redis_server, tmp_path, caplog):
    path = write_graph(tmp_path, redis_server.url)
    with Executor(load_graph(path)) as ex:
        assert ex.infer_sync({"text": "up"}).outputs["upper"] == "UP"
        redis_server.stop()
        for store in ex.cache.stores.values():
            store.retry_s = 0.0  # try Redis on every request (no rest after a fault)
        r = ex.infer_sync({"text": "down"})
        errors = sum(s.errors for s in ex.cache.stats.values())
        faults = sum(st.stats.faults for st in ex.cache.stores.values())
    assert r.outputs["upper"] == "DOWN" and r.outputs["y"].tolist() == [[8.0]]
    assert errors >= 1 and faults >= 1
    assert "redis" in caplog.text and "computing without the cache" in caplog.text


def test_redis_never_started_is_a_miss_not_an_error(tmp_path):
    path = write_graph(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    out, stats = run_once(path, "nobody")
    assert out == {"upper": "NOBODY", "y": [[12.0]]}
    assert stats["up"][2] >= 1


def _signed_graph(tmp_path: Path, url: str) -> Path:
    path = write_graph(tmp_path, url)
    path.write_text(path.read_text().replace(f'url: "{url}"', f'url: "{url}", hmac_key_env: USG_TEST_CACHE_KEY'))
    return path


def test_signed_values_are_shared_and_a_planted_value_is_not_served(redis_server, tmp_path, monkeypatch):
    """Anyone who can write the Redis database can plant a well-formed value with the right ports; with
    hmac_key_env only values written with the secret are served (another executor with it: a hit)."""
    import numpy as np
    import redis

    from usg.cache.codec import encode

    monkeypatch.setenv("USG_TEST_CACHE_KEY", "s" * 32)
    path = _signed_graph(tmp_path, redis_server.url)
    first, stats = run_once(path, "plant")
    assert first == {"upper": "PLANT", "y": [[10.0]]} and stats == {"up": (0, 1, 0), "emb": (0, 1, 0)}
    _, stats = run_once(path, "plant")  # a new executor (a new client) with the same secret
    assert stats == {"up": (1, 0, 0), "emb": (1, 0, 0)}

    client = redis.Redis.from_url(redis_server.url)
    keys = [k.decode() for k in client.keys("usg:cache:*")]
    assert len(keys) == 2
    for full in keys:  # what a writer without the secret can do: the right record, the wrong contents
        record = {"outputs": {"text": "PLANTED", "y": np.array([[666.0]], np.float32)}}
        client.set(full, encode(full.removeprefix("usg:cache:"), record))
    client.close()
    again, stats = run_once(path, "plant")
    assert again == first
    assert stats == {"up": (0, 1, 1), "emb": (0, 1, 1)}

    monkeypatch.setenv("USG_TEST_CACHE_KEY", "t" * 32)  # a new secret: every old entry is a miss, then refilled
    _, stats = run_once(path, "plant")
    assert stats == {"up": (0, 1, 1), "emb": (0, 1, 1)}
    _, stats = run_once(path, "plant")
    assert stats == {"up": (1, 0, 0), "emb": (1, 0, 0)}

    unsigned = write_graph(tmp_path, redis_server.url)
    out, stats = run_once(unsigned, "plant")  # a reader without the secret cannot decode a signed value: a miss
    assert out == first and stats == {"up": (0, 1, 1), "emb": (0, 1, 1)}
