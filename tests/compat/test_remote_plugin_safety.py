"""The LMCache remote plugin under stress: order, bad entries, hostile servers, metrics.

LMCache's real StorageManager on kvpool memory (the compat conftest ran
``install()``), the README's plugin config, real redis-servers (one per
test where a test pauses it) and tests/remote's hostile server:

* a get submitted after a put of the same key never reads the older entry
  (the server is paused for writes, so the put is held there while a read
  would be served at once);
* corrupt, truncated and foreign entries are misses with one warning each,
  naming the key; nothing escapes into LMCache and nothing leaks;
* a lying server (absurd lengths, a reply cut off, another key's entry, a
  trickle past the timeout) gives misses, typed in the counters;
* the connector's counters reach LMCache's Prometheus registry and
  LMCache's stats monitor sees the plugin's bytes.

A killed server and a close with puts in flight, on every kind of store:
``test_remote_plugin_outages.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import plugin_cases as cases
import pytest
import torch

import kvpool
from kvpool import MemoryFormat


@pytest.fixture
def plugin_log() -> Iterator[cases.Collect]:
    """Every record of the plugin's logger that its level lets through."""
    with cases.collecting(cases.PLUGIN_LOGGER) as handler:
        yield handler


def redis_client(server: Any) -> Any:
    import redis

    return redis.Redis(host=server.host, port=server.port)


def test_a_get_never_overtakes_a_put_of_its_key(own_redis_server, tmp_path, lmc, plugin_log):
    opened = cases.Opened(own_redis_server.url + "/0", tmp_path)
    try:
        written = cases.write_chunks(opened.manager, 1, None, seed=1)
        key = written["keys"][0]
        cases.wait_stored(opened.backend, [key])
        newer, newer_digest = opened.chunk(seed=2)
        assert newer_digest != written["digests"][0]
        # Writes wait at the server for 1.5 s; reads are served at once.
        assert own_redis_server.command("CLIENT", "PAUSE", "1500", "WRITE") == b"+OK"
        opened.backend.batched_submit_put_task([key], [newer])
        newer.ref_count_down()  # the backend holds its own reference
        got = opened.backend.get_blocking(key)  # submitted after the put
        assert got is not None
        assert cases.digest(got.byte_array) == newer_digest  # the new entry, not the old one
        got.ref_count_down()
    finally:
        opened.close()
    assert not plugin_log.at(logging.WARNING)


def test_bad_entries_are_misses_with_one_warning_each(redis_server, tmp_path, lmc, plugin_log):
    from kvpool.remote import RedisStore

    opened = cases.Opened(redis_server.url + "/0", tmp_path)
    client = redis_client(redis_server)
    try:
        written = cases.write_chunks(opened.manager, 4, None, seed=10)
        keys = written["keys"]
        cases.wait_stored(opened.backend, keys)
        names = [k.to_string() for k in keys]
        client.set("kvpool:" + names[0], b"not a kvpool entry at all")
        value = client.get("kvpool:" + names[2])
        client.set("kvpool:" + names[2], value[: len(value) - 100])  # truncated
        # A well-formed kvpool entry of another layout (hidden size 64, not 128).
        pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
        other = pool.allocate(torch.Size([2, 2, 16, 64]), torch.float16, MemoryFormat.KV_2LTD)
        other.tensor.fill_(1)
        with RedisStore(redis_server.url + "/0") as store:
            store.put(names[1], other)
        other.ref_count_down()
        pool.close()
        before = opened.allocator.stats().active_objects
        got = opened.backend.batched_get_blocking(keys)
        assert got[:3] == [None, None, None]
        assert got[3] is not None and cases.digest(got[3].byte_array) == written["digests"][3]
        got[3].ref_count_down()
        assert opened.backend.get_blocking(keys[0]) is None
        assert opened.allocator.stats().active_objects == before  # nothing held
        assert opened.allocator.memcheck()
        warnings = plugin_log.at(logging.WARNING)
        assert len(warnings) == 4, warnings
        named = sorted(next(n for n in names if repr(n) in m) for m in warnings)
        assert named == sorted([names[0], names[0], names[1], names[2]])
        assert all("read as a miss" in m for m in warnings)
        assert opened.connector.report.corrupt == 4
        errors = opened.connector.counters.snapshot()["unusable_entry"].errors
        assert errors == {"CorruptEntryError": 4}
    finally:
        client.close()
        opened.close()


def test_hostile_server_guarantees_hold_through_the_connector(tmp_path, lmc, plugin_log):
    from remote.hostile_server import Cut, HostileServer, Trickle, bulk

    server = HostileServer()
    opened = cases.Opened(server.url, tmp_path, "remote_storage_plugin.kvpool.timeout: 1")
    try:
        written = cases.write_chunks(opened.manager, 2, None, seed=20)
        keys = written["keys"]
        cases.wait_stored(opened.backend, keys)
        stored = [b"kvpool:" + k.to_string().encode() for k in keys]
        before = opened.allocator.stats().active_objects
        lies = {
            "absurd length": lambda args, honest: b"$99999999999999\r\n",
            "cut in the middle": lambda args, honest: Cut(honest[: len(honest) // 2]),
            "another key's entry": lambda args, honest: bulk(server.data[stored[1]]),
            "trickle past the timeout": lambda args, honest: Trickle(honest, 0.25, 3.0),
        }
        for what, lie in lies.items():
            server.rule(b"GET", lie)
            started = time.monotonic()
            assert opened.backend.get_blocking(keys[0]) is None, what
            assert time.monotonic() - started < 10, what  # liveness: bounded by the timeout
            assert opened.allocator.stats().active_objects == before, what
        server.rules.clear()
        got = opened.backend.get_blocking(keys[0])  # honest again: a hit
        assert got is not None and cases.digest(got.byte_array) == written["digests"][0]
        got.ref_count_down()
        errors = opened.connector.counters.snapshot()
        kinds = {kind for counts in errors.values() for kind in counts.errors}
        assert "CorruptEntryError" in kinds and "StoreTimeoutError" in kinds, errors
    finally:
        opened.close()
        server.close()


def test_counters_reach_prometheus_and_lmcaches_stats(redis_server, tmp_path, lmc):
    import prometheus_client

    opened = cases.Opened(redis_server.url + "/0", tmp_path)
    try:
        ev = cases.round_trip(opened.manager, n=4, partial=None)
        scrape = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
        stats = lmc.stats
        written = stats.interval_remote_write_bytes
        read = stats.interval_remote_read_bytes
    finally:
        opened.close()
    labels = 'name="lmcache:kvpool",store="KVPoolConnector"'
    assert f"kvpool_store_puts_total{{{labels}}} 4.0" in scrape
    # batched + single reads of the 4, the mixed pair, an unknown key, the removed key
    assert len(ev["batched"]) == len(ev["single"]) == 4
    assert f"kvpool_store_gets_total{{{labels}}} 12.0" in scrape
    assert f"kvpool_store_get_misses_total{{{labels}}} 3.0" in scrape
    chunk = cases.CHUNK_SHAPE.numel() * 2
    assert written == 4 * chunk  # LMCache's own accounting of the plugin's puts
    assert read >= 8 * chunk
    # A closed connector leaves the scrape.
    after = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert labels not in after
