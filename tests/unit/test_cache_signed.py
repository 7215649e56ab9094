"""Signed node-cache values (``cache: {hmac_key_env: VAR}``): only values written with the secret are served;
a value planted by another writer — even a well-formed one with the right ports — is a counted miss."""

import asyncio

import numpy as np
import pytest
from test_cache_executor import Counting, graph

from usg.cache.codec import encode
from usg.cache.memory import MemoryStore
from usg.cache.signed import MAGIC, SignedStore, read_secret
from usg.errors import GraphError
from usg.graph import load_graph
from usg.runtime import Executor

SECRET = b"0123456789abcdef0123456789abcdef"


def _run(coro):
    return asyncio.run(coro)


def test_a_signed_value_reads_back_and_anything_else_is_a_counted_miss():
    inner = MemoryStore()
    store = SignedStore(inner, SECRET, "K")
    _run(store.put("k1", b"value"))
    assert _run(store.get("k1")) == b"value"
    assert _run(store.get("absent")) is None and store.stats.rejected == 0

    signed = inner.get_now("k1")
    assert signed is not None and signed.startswith(MAGIC) and signed.endswith(b"value")
    cases = {
        "unsigned": b"value",
        "flipped-byte": signed[:-1] + b"X",
        "truncated": signed[: len(MAGIC) + 5],
        "empty": b"",
        "other-secret": _signed_by(b"another secret of 32 bytes......", "k1", b"value"),
    }
    for i, (name, data) in enumerate(cases.items(), 1):
        inner.put_now("k1", data)
        assert _run(store.get("k1")) is None, name
        assert store.stats.rejected == i, name
    # a valid value moved under another key is not that key's value
    inner.put_now("k2", signed)
    assert _run(store.get("k2")) is None


def _signed_by(secret: bytes, key: str, data: bytes) -> bytes:
    inner = MemoryStore()
    _run(SignedStore(inner, secret, "K").put(key, data))
    out = inner.get_now(key)
    assert out is not None
    return out


def test_the_secret_must_be_set_and_long_enough(monkeypatch):
    monkeypatch.delenv("USG_TEST_CACHE_KEY", raising=False)
    with pytest.raises(GraphError, match=r"cache\.hmac_key_env: hmac_key_env names 'USG_TEST_CACHE_KEY'.*not set"):
        read_secret("USG_TEST_CACHE_KEY", "cache.hmac_key_env")
    monkeypatch.setenv("USG_TEST_CACHE_KEY", "short")
    with pytest.raises(GraphError, match=r"holds 5 bytes; a signing secret needs at least 16(.|\n)*openssl rand"):
        read_secret("USG_TEST_CACHE_KEY", "cache.hmac_key_env")
    monkeypatch.setenv("USG_TEST_CACHE_KEY", SECRET.decode())
    assert read_secret("USG_TEST_CACHE_KEY", "cache.hmac_key_env") == SECRET


@pytest.mark.parametrize("value", ["my secret value", "", 42, "1ABC"])
def test_hmac_key_env_must_name_a_variable_not_hold_the_secret(value):
    with pytest.raises(GraphError, match=r"cache\.hmac_key_env: hmac_key_env is .*not an environment variable's name"):
        graph(backend="memory", hmac_key_env=value)


def test_a_misspelt_key_is_answered_with_the_right_one():
    with pytest.raises(GraphError, match=r"did you mean 'hmac_key_env'"):
        graph(backend="memory", hmac_key="USG_CACHE_KEY")


def test_an_unset_secret_fails_the_executor_at_start_naming_the_field(monkeypatch, tmp_path):
    monkeypatch.delenv("USG_TEST_CACHE_KEY", raising=False)
    with pytest.raises(GraphError, match=r"cache\.hmac_key_env: hmac_key_env names 'USG_TEST_CACHE_KEY'"):
        Executor(graph(backend="memory", hmac_key_env="USG_TEST_CACHE_KEY"), backends={"m": Counting()})
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\ninputs: {text: {modality: text}}\n"
        "nodes:\n  up: {fn: 'testops:upper', inputs: {text: inputs.text}, cache: {hmac_key_env: USG_TEST_CACHE_KEY}}\n"
        "outputs: {upper: up.text}\n"
    )
    with pytest.raises(GraphError, match=r"nodes\.up\.cache\.hmac_key_env: hmac_key_env names 'USG_TEST_CACHE_KEY'"):
        Executor(load_graph(path))


def test_a_well_formed_planted_value_is_served_unsigned_and_refused_signed(monkeypatch):
    """The threat: whoever can write the store can plant a value with the right ports and wrong contents."""
    monkeypatch.setenv("USG_TEST_CACHE_KEY", SECRET.decode())

    def plant_and_ask(**cache):
        fake = Counting()
        with Executor(graph(backend="memory", **cache), backends={"m": fake}) as ex:
            ex.infer_sync({"text": "abc"})
            store = next(iter(ex.cache.stores.values()))
            inner = store.inner if isinstance(store, SignedStore) else store
            for key in list(inner._items):
                inner.put_now(key, encode(key, {"outputs": {"y": np.array([[666.0]], np.float32)}}))
            answer = ex.infer_sync({"text": "abc"}).outputs["y"]
            return answer, ex.cache.stats["emb"], store.stats, len(fake.calls)

    answer, _, _, calls = plant_and_ask()
    np.testing.assert_array_equal(answer, [[666.0]])  # unsigned: the planted answer is served
    assert calls == 1

    answer, stats, store_stats, calls = plant_and_ask(hmac_key_env="USG_TEST_CACHE_KEY")
    np.testing.assert_array_equal(answer, [[6.0]])  # signed: computed again
    assert calls == 2 and stats.errors == 1 and stats.hits == 0 and store_stats.rejected == 1


def test_signed_values_are_hits_for_an_executor_with_the_same_secret(monkeypatch):
    monkeypatch.setenv("USG_TEST_CACHE_KEY", SECRET.decode())
    fake = Counting()
    with Executor(graph(backend="memory", hmac_key_env="USG_TEST_CACHE_KEY"), backends={"m": fake}) as ex:
        first = ex.infer_sync({"text": "abcd"}).outputs["y"]
        second = ex.infer_sync({"text": "abcd"}).outputs["y"]
        stats = ex.cache.stats["emb"]
    np.testing.assert_array_equal(first, second)
    assert (stats.hits, stats.misses, stats.errors, len(fake.calls)) == (1, 1, 0, 1)


def test_a_flood_of_rejected_values_logs_one_warning_per_interval(caplog):
    inner = MemoryStore()
    store = SignedStore(inner, SECRET, "USG_CACHE_KEY")
    inner.put_now("k", b"planted")
    with caplog.at_level("WARNING", logger="usg.cache"):
        for _ in range(50):
            assert _run(store.get("k")) is None
    lines = [r.getMessage() for r in caplog.records]
    assert store.stats.rejected == 50 and len(lines) == 1
    assert "it is not signed" in lines[0] and "the same $USG_CACHE_KEY" in lines[0]
