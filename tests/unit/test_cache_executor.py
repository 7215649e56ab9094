"""The node cache in the executor, on fake backends: hits skip upstream nodes, single flight,
integrity digests, eviction, TTL, poisoned values, model identity, graph ``cache:`` parsing."""

import asyncio
import hashlib
import re
import threading
import time

import numpy as np
import pytest

from usg.cache.codec import encode
from usg.errors import GraphError, InputError
from usg.graph import GraphBuilder, load_graph
from usg.runtime import Executor
from usg.specs import TensorSpec
from usg.testing import FakeBackend


class Counting(FakeBackend):
    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()

        def handler(inp):
            time.sleep(self.delay_s)
            return {"y": inp["x"] * 2}

        spec = TensorSpec("float32", ("batch", None))
        super().__init__(handler, input_specs={"x": spec}, output_specs={"y": spec})


def graph(model_path=None, *, node_cache=True, **graph_cache):
    b = GraphBuilder("cached").input("text", "text", optional=True)
    b.model("m", "python", path=model_path, options={"callable": "testops:identity"})
    b.node("len", fn="testops:length", inputs={"text": "inputs.text"})
    b.node("emb", model="m", inputs={"x": "len.n"}, cache=node_cache)
    b.output("y", "emb.y")
    if graph_cache:
        b.cache(**graph_cache)
    return b.build()


def test_a_repeated_input_is_served_from_the_cache_and_its_upstream_does_not_run():
    fake = Counting()
    with Executor(graph(), backends={"m": fake}) as ex:
        first = ex.infer_sync({"text": "abcd"})
        second = ex.infer_sync({"text": "abcd"})
        other = ex.infer_sync({"text": "xy"})
        stats = ex.cache.stats["emb"]
    np.testing.assert_array_equal(first.outputs["y"], second.outputs["y"])
    assert len(fake.calls) == 2  # abcd once, xy once
    assert "len" in first.node_ms and "len" not in second.node_ms  # upstream skipped on the hit
    assert second.pruned_nodes == []
    assert (stats.hits, stats.misses, stats.stores) == (1, 2, 2)
    np.testing.assert_array_equal(other.outputs["y"], [[4.0]])


def test_cache_false_on_the_executor_computes_every_time():
    fake = Counting()
    with Executor(graph(), backends={"m": fake}, cache=False) as ex:
        ex.infer_sync({"text": "abcd"})
        ex.infer_sync({"text": "abcd"})
        assert ex.cache is None
    assert len(fake.calls) == 2


def test_identical_concurrent_requests_are_computed_once():
    fake = Counting(delay_s=0.2)

    async def main():
        async with Executor(graph(), backends={"m": fake}) as ex:
            results = await asyncio.gather(*(ex.infer({"text": "same"}) for _ in range(8)))
            return results, ex.cache.stats["emb"]

    results, stats = asyncio.run(main())
    assert len(fake.calls) == 1
    assert stats.coalesced == 7 and stats.misses == 1
    for r in results:
        np.testing.assert_array_equal(r.outputs["y"], [[8.0]])


def test_a_failed_leader_lets_its_followers_compute():
    calls = []

    def handler(inp):
        calls.append(1)
        time.sleep(0.1)
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        return {"y": inp["x"] * 2}

    spec = TensorSpec("float32", ("batch", None))
    fake = FakeBackend(handler, input_specs={"x": spec}, output_specs={"y": spec})

    async def main():
        async with Executor(graph(), backends={"m": fake}) as ex:
            return await asyncio.gather(*(ex.infer({"text": "ab"}) for _ in range(3)), return_exceptions=True)

    results = asyncio.run(main())
    assert sum(isinstance(r, Exception) for r in results) == 1
    assert [r.outputs["y"].tolist() for r in results if not isinstance(r, Exception)] == [[[4.0]], [[4.0]]]


def test_every_result_carries_the_sha256_of_each_input_as_received():
    with Executor(graph(), backends={"m": Counting()}) as ex:
        r = ex.infer_sync({"text": "héllo"})
    assert r.integrity == {"text": "sha256:" + hashlib.sha256("héllo".encode()).hexdigest()}
    assert r.to_json_dict()["integrity"] == r.integrity


def test_an_expected_digest_that_differs_is_a_400_naming_the_input_and_both_digests():
    good = hashlib.sha256(b"abc").hexdigest()
    with Executor(graph(), backends={"m": Counting()}) as ex:
        ok = ex.infer_sync({"text": "abc"}, expect_sha256={"text": f"sha256:{good}"})
        assert ok.integrity["text"] == f"sha256:{good}"
        with pytest.raises(InputError, match=rf"input 'text'.*sha256:{good}.*expected sha256:{'0' * 64}") as exc:
            ex.infer_sync({"text": "abc"}, expect_sha256={"text": "0" * 64})
        assert exc.value.status == 400
        with pytest.raises(InputError, match="not 64 hex digits"):
            ex.infer_sync({"text": "abc"}, expect_sha256={"text": "abc"})


def test_memory_cache_evicts_within_max_bytes():
    fake = Counting()
    with Executor(graph(max_bytes=700), backends={"m": fake}) as ex:
        for t in ("a", "bb", "ccc", "a"):
            ex.infer_sync({"text": t})
        store = next(iter(ex.cache.stores.values()))
    assert store.stats.evictions >= 1 and store.stats.bytes_held <= 700
    assert len(fake.calls) == 4  # "a" was evicted before it came again


def test_memory_cache_ttl_expires_entries():
    fake = Counting()
    with Executor(graph(ttl_s=0.2), backends={"m": fake}) as ex:
        ex.infer_sync({"text": "a"})
        ex.infer_sync({"text": "a"})
        time.sleep(0.3)
        ex.infer_sync({"text": "a"})
    assert len(fake.calls) == 2


def test_a_poisoned_value_is_a_miss_and_a_warning_counter_never_an_error():
    fake = Counting()
    with Executor(graph(), backends={"m": fake}) as ex:
        ex.infer_sync({"text": "abc"})
        store = next(iter(ex.cache.stores.values()))
        for key in list(store._items):
            store.put_now(key, b"\x80\x04garbage")
        r = ex.infer_sync({"text": "abc"})
        errors = ex.cache.stats["emb"].errors
    np.testing.assert_array_equal(r.outputs["y"], [[6.0]])
    assert errors == 1 and len(fake.calls) == 2


def test_a_value_stored_under_another_model_file_is_never_served(tmp_path):
    model = tmp_path / "m.bin"
    model.write_bytes(b"weights v1")
    stores = {}
    fake = Counting()
    with Executor(graph(model), backends={"m": fake}) as ex:
        ex.infer_sync({"text": "abc"})
        stores = ex.cache.stores
    model.write_bytes(b"weights v2, replaced")
    from usg.cache import NodeCache

    g = graph(model)
    with Executor(g, backends={"m": fake}, cache=False) as ex:
        ex.cache = NodeCache(g, lambda e: None, dict, stores=stores)  # the same store, a new model file
        ex.cache.prepare()
        ex.infer_sync({"text": "abc"})
        assert ex.cache.stats["emb"].misses == 1 and ex.cache.stats["emb"].hits == 0
    assert len(fake.calls) == 2


def test_uncached_graphs_have_no_cache_and_a_graph_default_caches_every_node():
    assert Executor(graph(node_cache=None), backends={"m": Counting()}).cache is None
    g = graph(node_cache=None, default=True)
    assert all(n.cache is not None for n in g.nodes.values())
    g_off = graph(node_cache=True, backend="off")
    assert all(n.cache is None for n in g_off.nodes.values())


def test_cache_section_mistakes_name_the_field_the_value_and_the_fix(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\ninputs: {text: {modality: text}}\n"
        "cache: {backnd: memory, max_bytes: -1}\n"
        "nodes:\n  len: {fn: 'testops:length', inputs: {text: inputs.text}, cache: {backend: reddis}}\n"
        "outputs: {n: len.n}\n"
    )
    with pytest.raises(GraphError) as exc:
        load_graph(path)
    text = str(exc.value)
    assert "cache.backnd" in text and "did you mean 'backend'" in text
    assert "cache.max_bytes" in text and "max_bytes is -1" in text
    assert "nodes.len.cache.backend" in text and "did you mean 'redis'" in text


def test_cache_yes_and_no_in_yaml(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\ninputs: {text: {modality: text}}\n"
        "cache: {backend: redis, url: 'redis://127.0.0.1:1/0', ttl_s: 5}\n"
        "nodes:\n  a: {fn: 'testops:length', inputs: {text: inputs.text}, cache: true}\n"
        "  b: {fn: 'testops:upper', inputs: {text: inputs.text}, cache: {backend: memory}}\n"
        "  c: {fn: 'testops:upper', inputs: {text: inputs.text}, cache: yes-please}\n"
        "outputs: {n: a.n, u: b.text}\n"
    )
    with pytest.raises(GraphError, match=r"(?s)nodes.c.cache: cache is 'yes-please'.*fix: write cache: true"):
        load_graph(path)
    path.write_text(
        path.read_text().replace("  c: {fn: 'testops:upper', inputs: {text: inputs.text}, cache: yes-please}\n", "")
    )
    g = load_graph(path)
    assert g.nodes["a"].cache.backend == "redis" and g.nodes["a"].cache.ttl_s == 5
    assert g.nodes["b"].cache.backend == "memory"


def test_uncacheable_outputs_are_counted_and_the_request_still_answers():
    fake = Counting()
    with Executor(graph(), backends={"m": fake}) as ex:
        from usg.cache import node_cache

        original = node_cache.encode
        node_cache.encode = lambda key, v: encode(key, {"bad": object()})
        try:
            r = ex.infer_sync({"text": "abc"})
        finally:
            node_cache.encode = original
        assert ex.cache.stats["emb"].uncacheable == 1
    np.testing.assert_array_equal(r.outputs["y"], [[6.0]])


def test_a_leader_that_times_out_releases_its_key_and_a_follower_that_times_out_changes_nothing():
    from usg.errors import RequestTimeout

    fake = Counting(delay_s=0.3)

    async def main():
        async with Executor(graph(), backends={"m": fake}) as ex:
            leader = asyncio.create_task(ex.infer({"text": "slow"}, timeout_s=0.05))
            await asyncio.sleep(0)
            follower = asyncio.create_task(ex.infer({"text": "slow"}, timeout_s=5))
            impatient = asyncio.create_task(ex.infer({"text": "slow"}, timeout_s=0.01))
            with pytest.raises(RequestTimeout):
                await leader
            with pytest.raises(RequestTimeout):
                await impatient
            r = await follower  # the leader gave up: the follower computed the node itself
            again = await ex.infer({"text": "slow"})
            return r, again, ex.cache.stats["emb"], ex.cache._inflight

    r, again, stats, inflight = asyncio.run(main())
    np.testing.assert_array_equal(r.outputs["y"], [[8.0]])
    np.testing.assert_array_equal(again.outputs["y"], [[8.0]])
    assert stats.hits == 1 and inflight == {}


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def image_graph(**limits):
    b = GraphBuilder("img").input("image", "image")
    b.node("raw", fn="testops:raw_image", inputs={"image": "inputs.image"}, cache=True)
    b.output("hwc", "raw.hwc")
    if limits:
        b.limits(**limits)
    return b.build()


def test_a_hit_is_answered_from_the_received_bytes_without_decoding_the_image(monkeypatch):
    from usg.runtime import inputs

    decoded = []
    real = inputs.decode_image
    monkeypatch.setattr(inputs, "decode_image", lambda *a, **k: decoded.append(1) or real(*a, **k))
    data = _png(64, 32)
    with Executor(image_graph()) as ex:
        first = ex.infer_sync({"image": data})
        second = ex.infer_sync({"image": data})
    assert len(decoded) == 1  # the miss decoded; the hit did not
    np.testing.assert_array_equal(first.outputs["hwc"], second.outputs["hwc"])
    assert first.outputs["hwc"].shape == (32, 64, 3) and first.integrity == second.integrity


def test_a_hit_never_bypasses_a_limit_the_miss_would_enforce():
    """Header limits (pixels, aspect ratio, formats) are checked before the lookup; a body that
    does not decode is refused on the miss and so never stored; a value stored under other
    limits is another key."""
    from usg.errors import PayloadTooLarge

    wide = _png(3000, 20)  # aspect ratio 150:1
    with Executor(image_graph(max_aspect_ratio=10)) as ex:
        for _ in range(2):
            with pytest.raises(PayloadTooLarge, match="aspect ratio of 150:1"):
                ex.infer_sync({"image": wide})
        cut = _png(64, 32)
        cut = cut[: len(cut) - 40]  # header intact, pixel data cut
        for _ in range(2):
            with pytest.raises(InputError, match="truncated or corrupt"):
                ex.infer_sync({"image": cut})
        assert ex.cache.stats["raw"].stores == 0
        gif_only = image_graph(image_formats=["GIF"])
    from usg.cache.key import node_keys

    digests = {"image": hashlib.sha256(wide).hexdigest()}
    ids = {"raw": "same"}
    assert node_keys(image_graph(), ids, digests, ["raw"]) != node_keys(gif_only, ids, digests, ["raw"])
    with Executor(gif_only) as ex, pytest.raises(InputError, match="allowed format"):
        ex.infer_sync({"image": _png(64, 32)})


@pytest.mark.parametrize(
    "record",
    [{"outputs": ["abc"]}, [1, 2], {"outputs": {"y": 1}, "alias": ["y"]}, "text", None],
    ids=["outputs-a-list", "record-a-list", "alias-unhashable", "record-a-str", "record-none"],
)
def test_a_well_encoded_value_that_is_not_a_node_record_is_a_miss(record):
    fake = Counting()
    with Executor(graph(), backends={"m": fake}) as ex:
        ex.infer_sync({"text": "abc"})
        store = next(iter(ex.cache.stores.values()))
        for key in list(store._items):
            store.put_now(key, encode(key, record))
        r = ex.infer_sync({"text": "abc"})
        errors = ex.cache.stats["emb"].errors
    np.testing.assert_array_equal(r.outputs["y"], [[6.0]])
    assert errors == 1 and len(fake.calls) == 2


@pytest.mark.parametrize("outputs", [{}, {"z": np.zeros((1, 1), np.float32)}], ids=["no-outputs", "another-port"])
def test_a_stored_value_without_a_port_the_graph_reads_is_a_miss_not_a_missing_output(outputs, caplog):
    fake = Counting()
    with Executor(graph(), backends={"m": fake}) as ex:
        ex.infer_sync({"text": "abc"})
        store = next(iter(ex.cache.stores.values()))
        for key in list(store._items):
            store.put_now(key, encode(key, {"outputs": outputs, "alias": None}))
        r = ex.infer_sync({"text": "abc"})
        errors = ex.cache.stats["emb"].errors
    np.testing.assert_array_equal(r.outputs["y"], [[6.0]])  # computed, not served without 'y'
    assert errors == 1 and len(fake.calls) == 2
    assert "lack the port(s) y the graph reads" in caplog.text


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://127.0.0.1:abc/0", "Port could not be cast to integer value as 'abc'"),
        ("redis://127.0.0.1:99999/0", "Port out of range 0-65535"),
        ("redis://[::1/0", "Invalid IPv6 URL"),
    ],
)
def test_a_redis_url_that_does_not_parse_fails_the_graph_not_every_request(tmp_path, url, why):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\ninputs: {text: {modality: text}}\n"
        f"cache: {{backend: redis, url: '{url}'}}\n"
        "nodes:\n  len: {fn: 'testops:length', inputs: {text: inputs.text}, cache: true}\n"
        "outputs: {n: len.n}\n"
    )
    with pytest.raises(GraphError, match=rf"(?s)cache\.url.*does not parse \({re.escape(why)}\).*redis://HOST:PORT/DB"):
        load_graph(path)


def test_a_redis_store_whose_url_the_client_refuses_is_a_fault_not_an_error():
    pytest.importorskip("redis")
    from usg.cache.redis_store import RedisStore

    store = RedisStore("redis://127.0.0.1:abc/0")  # the Python API does not go through graph validation
    assert asyncio.run(store.get("k")) is None
    asyncio.run(store.put("k", b"v"))
    assert store.stats.faults == 1  # the put came while the store rests after the get's fault
