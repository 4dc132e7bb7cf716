"""AsyncRedisClusterStore against a real three-master Redis Cluster on loopback.

The asyncio contract runs in ``test_async_stores.py``; here: entries shared
with the blocking RedisClusterStore over all masters, MOVED and ASK, one
slot-map read for many concurrent calls, a stalled master (SIGSTOP) bounded
by the timeout and cancelled mid-call, and closing with calls in flight.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import ArgumentTypeError, PoolClosedError, RemoteStoreError, StoreTimeoutError
from kvpool.remote import AsyncRedisClusterStore, RedisClusterStore, open_async_store
from kvpool.remote.cluster.slots import SLOTS, key_slot

from .cluster_servers import RedisCluster, start_cluster
from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .test_async_stores import run

pytestmark = pytest.mark.redis


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """Three masters for this test alone (it stops a node or moves slots)."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def big_pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    """A pool for 200 objects of KV_SHAPE, empty at the end."""
    p = kvpool.TensorMemoryAllocator(torch.empty(200 * 8192, dtype=torch.uint8))
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


def _prefix() -> str:
    return f"ac-{uuid.uuid4().hex[:12]}:"


@functools.cache
def _admin(port: int) -> Any:
    """A client of one node (one per port: its connection is not counted as the store's)."""
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)


def _keys_over_all_slots(prefix: str, count: int) -> list[str]:
    """``count`` keys whose slots are spread evenly over 0..16383."""
    band = SLOTS // count
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        key = f"key-{i}"
        if key_slot((prefix + key).encode()) // band == len(keys):
            keys.append(key)
        i += 1
    return keys


def _owner(cluster: RedisCluster, rkey: str) -> int:
    """The port of the master that holds ``rkey``'s slot (asked of the cluster itself)."""
    slot = key_slot(rkey.encode())
    for start, end, master, *_ in _admin(cluster.ports[0]).execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return int(master[1])
    raise AssertionError(f"no master serves slot {slot}")


def _client_ids(cluster: RedisCluster) -> dict[int, set[str]]:
    """Per node, the ids of its client connections (but the one asking)."""
    return {
        port: {str(c["id"]) for c in _admin(port).client_list() if c["cmd"] != "client|list"}
        for port in cluster.ports
    }


def _slots_calls(cluster: RedisCluster) -> int:
    """``CLUSTER SLOTS`` commands served by all nodes so far."""
    total = 0
    for port in cluster.ports:
        stats = _admin(port).info("commandstats")
        total += int(stats.get("cmdstat_cluster|slots", {}).get("calls", 0))
    return total


def test_entries_shared_with_the_blocking_store_over_every_master(
    redis_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    keys = _keys_over_all_slots(prefix, 96)
    objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 96, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    assert len({_owner(redis_cluster, prefix + k) for k in keys}) == 3
    blocking = RedisClusterStore(redis_cluster.url, prefix=prefix)

    async def main() -> None:
        async with AsyncRedisClusterStore(redis_cluster.url, prefix=prefix) as store:
            await store.batched_put(keys[:48], objs[:48])  # async writes, blocking reads
            blocking.batched_put(keys[48:], objs[48:])  # and the other way round
            back = blocking.batched_get(keys[:48], big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert [bytes(b.byte_array) for b in back] == datas[:48]  # type: ignore[union-attr]
            big_pool.batched_free(back)  # type: ignore[arg-type]
            got = await store.batched_get([*keys[48:], "none"], big_pool)  # stored layout
            assert got[-1] is None
            assert [bytes(g.byte_array) for g in got[:-1]] == datas[48:]  # type: ignore[union-attr]
            big_pool.batched_free(got[:-1])  # type: ignore[arg-type]
            assert sorted(store.masters) == sorted(("127.0.0.1", p) for p in redis_cluster.ports)
            info = await store.head(keys[3])
            assert info is not None and info.size == objs[3].get_size()
            assert await store.batched_exists([keys[0], keys[95], "none"]) == [True, True, False]
            assert await store.batched_delete([*keys, "none"]) == 96
            assert blocking.batched_exists(keys[:3]) == [False] * 3

    run(main())
    blocking.close()
    big_pool.batched_free(objs)


def _move_slot(cluster: RedisCluster, slot: int, src: int, dst: int, keys: list[str]) -> None:
    """Migrate ``keys`` (all of ``slot``) from ``src`` to ``dst`` and give ``dst`` the slot."""
    ids = {p: _admin(p).execute_command("CLUSTER", "MYID") for p in cluster.ports}
    _admin(dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    _admin(src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    if keys:
        _admin(src).execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
    for port in cluster.ports:
        _admin(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])


def test_moved_then_ask(own_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator) -> None:
    objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(4)]
    datas = [fill(o, 20 + i) for i, o in enumerate(objs)]

    async def main() -> None:
        store = AsyncRedisClusterStore(own_cluster.url, prefix="m:")
        await store.put("{a}x", objs[0])
        old = _owner(own_cluster, "m:{a}x")
        new = next(p for p in own_cluster.ports if p != old)
        _move_slot(own_cluster, key_slot(b"m:{a}x"), old, new, ["m:{a}x"])
        # The store's map is stale: the old owner answers MOVED, the map is read again.
        got = await store.get("{a}x", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == datas[0]
        got.ref_count_down()
        slot = key_slot(b"m:{a}x")
        assert ("127.0.0.1", new) in store.masters
        assert store._nodes.slot_map().owner(slot) == ("127.0.0.1", new)

        # ASK: a slot half migrated; the key that left is read at the destination.
        await store.batched_put(["{b}moved", "{b}stays"], objs[1:3])
        src = _owner(own_cluster, "m:{b}moved")
        dst = next(p for p in own_cluster.ports if p != src)
        ids = {p: _admin(p).execute_command("CLUSTER", "MYID") for p in own_cluster.ports}
        bslot = key_slot(b"m:{b}moved")
        _admin(dst).execute_command("CLUSTER", "SETSLOT", bslot, "IMPORTING", ids[src])
        _admin(src).execute_command("CLUSTER", "SETSLOT", bslot, "MIGRATING", ids[dst])
        _admin(src).execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", "m:{b}moved")
        back = await store.batched_get(["{b}moved", "{b}stays"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert [bytes(b.byte_array) for b in back] == datas[1:3]  # type: ignore[union-attr]
        pool.batched_free(back)  # type: ignore[arg-type]
        assert (await store.head("{b}moved")).size == objs[1].get_size()  # type: ignore[union-attr]
        await store.put("{b}new", objs[3])  # absent at the source: ASK, written at the destination
        assert _admin(dst).execute_command("CLUSTER", "COUNTKEYSINSLOT", bslot) == 2
        assert store._nodes.slot_map().owner(bslot) == ("127.0.0.1", src)  # ASK keeps the map
        assert await store.exists("{b}new") and await store.delete("{b}moved")
        await store.aclose()

    run(main())
    pool.batched_free(objs)


def test_concurrent_calls_read_the_slot_map_once(
    redis_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator
) -> None:
    async def main() -> None:
        store = AsyncRedisClusterStore(redis_cluster.url, prefix=_prefix())
        before = _slots_calls(redis_cluster)
        # 24 calls start at once with no map known: they share one read.
        found = await asyncio.gather(*(store.exists(f"k{i}") for i in range(24)))
        assert found == [False] * 24
        assert _slots_calls(redis_cluster) - before == 1
        await store.refresh()  # asked for: a second read
        assert _slots_calls(redis_cluster) - before == 2
        await store.aclose()

    run(main())


def _stop(cluster: RedisCluster, port: int) -> None:
    os.kill(cluster.procs[port].pid, signal.SIGSTOP)


def _resume(cluster: RedisCluster, port: int) -> None:
    os.kill(cluster.procs[port].pid, signal.SIGCONT)


def test_stalled_master_bounded_by_the_timeout_and_cancelled_mid_call(
    own_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    keys = _keys_over_all_slots(prefix, 60)
    objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 60, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    victim = own_cluster.ports[2]
    live = [i for i, k in enumerate(keys) if _owner(own_cluster, prefix + k) != victim]
    assert 0 < len(live) < len(keys)

    async def main() -> None:
        store = AsyncRedisClusterStore(own_cluster.url, prefix=prefix, timeout=1.0)
        await store.batched_put(keys, objs)
        _stop(own_cluster, victim)
        try:
            # The whole call ends by its deadline; what the live masters sent is freed.
            start = time.monotonic()
            with pytest.raises(StoreTimeoutError, match=r"1\.0 s"):
                await store.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert time.monotonic() - start < 3.0
            assert big_pool.stats().active_objects == 60  # only the sources
            # Cancelled while the victim's lane waits and the others have finished.
            slow = AsyncRedisClusterStore(own_cluster.url, prefix=prefix, timeout=30.0)
            task = asyncio.create_task(slow.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT))
            deadline = time.monotonic() + 10
            while big_pool.stats().active_objects < 60 + len(live):
                assert time.monotonic() < deadline, "the live masters' entries never arrived"
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert big_pool.stats().active_objects == 60  # every destination freed
        finally:
            _resume(own_cluster, victim)
        got = await slow.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
        big_pool.batched_free(got)  # type: ignore[arg-type]
        await slow.aclose()
        await store.aclose()

    run(main(), 60)
    big_pool.batched_free(objs)


def test_aclose_with_calls_in_flight(
    redis_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    keys = _keys_over_all_slots(prefix, 32)
    objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 32, KV_FMT)
    assert objs is not None
    for i, o in enumerate(objs):
        fill(o, i)
    before = _client_ids(redis_cluster)
    outcomes: list[Any] = []

    async def main() -> None:
        store = AsyncRedisClusterStore(redis_cluster.url, prefix=prefix, timeout=5.0)
        await store.ping()
        tasks = [
            asyncio.create_task(store.batched_put([f"{k}-{j}" for k in keys], objs))
            for j in range(16)
        ]
        await asyncio.sleep(0.01)  # the calls are on their way
        start = time.monotonic()
        await store.aclose()
        assert time.monotonic() - start < 2.0
        outcomes.extend(await asyncio.gather(*tasks, return_exceptions=True))
        with pytest.raises(PoolClosedError):
            await store.exists("x")

    run(main())
    # Each put finished or failed with a typed error; none is left running.
    assert all(o is None or isinstance(o, (RemoteStoreError, PoolClosedError)) for o in outcomes)
    deadline = time.monotonic() + 5
    while True:
        after = _client_ids(redis_cluster)
        left = {p: after[p] - before[p] for p in after}
        threads = [t.name for t in threading.enumerate() if t.name.startswith("kvpool-connect")]
        if not any(left.values()) and not threads:
            break
        assert time.monotonic() < deadline, f"left open: {left}, threads {threads}"
        time.sleep(0.05)
    big_pool.batched_free(objs)
    cleanup = RedisClusterStore(redis_cluster.url, prefix=prefix)
    cleanup.batched_delete([f"{k}-{j}" for k in keys for j in range(16)])
    cleanup.close()


def test_open_async_store_takes_a_cluster_url(redis_cluster: RedisCluster) -> None:
    store = open_async_store(redis_cluster.url, prefix=_prefix(), timeout=2.5, window=4)
    assert isinstance(store, AsyncRedisClusterStore)
    assert store.timeout == 2.5
    run(store.ping())
    assert len(store.masters) == 3
    store.close()
    with pytest.raises(ArgumentTypeError, match="io_threads"):
        open_async_store(redis_cluster.url, io_threads=2)  # a blocking store's option only
