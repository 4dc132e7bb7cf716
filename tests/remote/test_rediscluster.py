"""RedisClusterStore against a real three-master Redis Cluster on loopback.

The contract every store meets runs in ``test_stores.py``; here: keys over
all slots and all masters, the entry format shared with RedisStore, a slot
moved (MOVED) and one being migrated (ASK), a master SIGKILLed in the
middle of a run and brought back, seeds and URLs.  Without a server: the
slot hash and the redirect parser.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import InvalidArgumentError, RemoteStoreError, StoreConnectionError
from kvpool.remote import RedisClusterStore, RedisStore, open_store
from kvpool.remote.cluster.route import Redirect, parse_redirect
from kvpool.remote.cluster.slots import SLOTS, key_slot
from kvpool.remote.redis.resp import ProtocolError

from .cluster_servers import RedisCluster, start_cluster
from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill

pytestmark = pytest.mark.redis


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """Three masters for this test alone (it kills a node or moves slots)."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def big_pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    """A pool for 300 objects of KV_SHAPE, empty at the end."""
    p = kvpool.TensorMemoryAllocator(torch.empty(300 * 8192, dtype=torch.uint8))
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


def _prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}:"


def _admin(cluster: RedisCluster, port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)


def _node_ids(cluster: RedisCluster) -> dict[int, str]:
    out = {}
    for port in cluster.ports:
        out[port] = _admin(cluster, port).execute_command("CLUSTER", "MYID")
    return out


def _keys_over_all_slots(prefix: str, count: int) -> list[str]:
    """``count`` keys whose slots are spread evenly over 0..16383 (one per band)."""
    band = SLOTS // count
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        key = f"key-{i}"
        if key_slot((prefix + key).encode()) // band == len(keys):
            keys.append(key)
        i += 1
    return keys


def _owner_port(cluster: RedisCluster, store: RedisClusterStore, key: str) -> int:
    slot = key_slot(store._prefix + key.encode())
    return store._nodes.slot_map().owner(slot)[1]  # type: ignore[index]


def _bounded(fn: Callable[[], Any], seconds: float) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the call did not return within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- without a server ---------------------------------------------------


def test_key_slot_matches_the_specification() -> None:
    assert key_slot(b"123456789") == 0x31C3  # the CRC16 check value of the spec
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers")
    assert key_slot(b"foo{}{bar}") == key_slot(b"foo{}{bar}") != key_slot(b"bar")
    assert key_slot(b"foo{{bar}}zap") == key_slot(b"{bar")
    assert key_slot(b"foo{bar}{zap}") == key_slot(b"bar")


def test_redirect_lines() -> None:
    assert parse_redirect(b"-MOVED 3999 127.0.0.1:6381") == Redirect(
        False, 3999, ("127.0.0.1", 6381)
    )
    assert parse_redirect(b"-ASK 1 [::1]:7000") == Redirect(True, 1, ("::1", 7000))
    assert parse_redirect(b"-ERR nope") is None and parse_redirect(b"$5") is None
    for bad in (
        b"-MOVED x y",
        b"-MOVED 99999 h:1",
        b"-ASK 1 h:0",
        b"-MOVED 1 " + b"h" * 400 + b":1",
    ):
        with pytest.raises(ProtocolError):
            parse_redirect(bad)


@pytest.mark.parametrize(
    ("nodes", "match"),
    [
        ("redis-cluster://", "names no node"),
        ("redis-cluster://host", "not host:port"),
        ("redis-cluster://h:1,h:99999", "not host:port"),
        ("redis-cluster://h:1/2", "only database 0"),
        ("redis://h:1", "not a cluster URL"),
        ([], "non-empty list"),
        ([("h", "1")], "seed node"),
        (42, "redis-cluster://"),
    ],
)
def test_bad_seeds(nodes: Any, match: str) -> None:
    pytest.importorskip("redis")
    with pytest.raises(InvalidArgumentError, match=match):
        RedisClusterStore(nodes, ping=False)


def test_dead_seeds_fail_fast_without_secrets() -> None:
    pytest.importorskip("redis")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreConnectionError, match="CLUSTER SLOTS") as info:
        _bounded(lambda: RedisClusterStore(f"redis-cluster://u:s3cr3t@127.0.0.1:{port}"), 20)
    assert "s3cr3t" not in str(info.value)


# -- keys over the whole cluster ----------------------------------------


def test_256_keys_over_all_slots_and_masters(
    redis_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    store = RedisClusterStore(redis_cluster.url, prefix=prefix)
    keys = _keys_over_all_slots(prefix, 256)
    owners = {_owner_port(redis_cluster, store, k) for k in keys}
    assert owners == set(redis_cluster.ports)  # every master holds some
    objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 256, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    for key, obj in zip(keys[:16], objs[:16], strict=True):
        store.put(key, obj)
    store.batched_put(keys[16:], objs[16:])
    big_pool.batched_free(objs)
    # Each entry lives on its slot's master only; the server agrees on the slot.
    for key in keys[::17]:
        rkey = prefix + key
        owner = _owner_port(redis_cluster, store, key)
        admin = _admin(redis_cluster, owner)
        assert admin.execute_command("CLUSTER", "KEYSLOT", rkey) == key_slot(rkey.encode())
        assert admin.exists(rkey) == 1
        slot = key_slot(rkey.encode())
        for port in redis_cluster.ports:
            held = _admin(redis_cluster, port).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
            assert (held > 0) == (port == owner)
    got = store.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
    big_pool.batched_free(got)  # type: ignore[arg-type]
    one = store.get(keys[200], big_pool)
    assert one is not None and bytes(one.byte_array) == datas[200]
    one.ref_count_down()
    assert store.batched_exists([*keys[::32], "absent"]) == [True] * 8 + [False]
    assert store.head(keys[5]).size == KV_SHAPE.numel() * 2  # type: ignore[union-attr]
    assert store.batched_delete([*keys, "absent"]) == 256
    assert store.batched_exists(keys[::32]) == [False] * 8
    store.close()


def test_parallel_groups(
    redis_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    with RedisClusterStore(redis_cluster.url, prefix=prefix, io_threads=3) as store:
        keys = _keys_over_all_slots(prefix, 48)
        objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 48, KV_FMT)
        datas = [fill(o, 7 + i) for i, o in enumerate(objs)]  # type: ignore[arg-type]
        store.batched_put(keys, objs)  # type: ignore[arg-type]
        got = store.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
        big_pool.batched_free([*objs, *got])  # type: ignore[list-item]


def test_same_entries_as_redis_store(
    redis_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    store = RedisClusterStore(redis_cluster.url, prefix=prefix)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 3)
    store.put("shared", src)
    node = f"redis://127.0.0.1:{_owner_port(redis_cluster, store, 'shared')}/0"
    with RedisStore(node, prefix=prefix) as single:
        got = single.get("shared", pool, KV_SHAPE, KV_DTYPE, KV_FMT)  # written by the cluster store
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        single.put("shared", src)  # and the other way round
    again = store.get("shared", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert again is not None and bytes(again.byte_array) == data
    for obj in (src, again):
        obj.ref_count_down()
    store.close()


def test_seeds_as_list_tuples_url_and_redis_cluster(
    redis_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator
) -> None:
    import redis
    from redis.cluster import ClusterNode

    dead = "127.0.0.1:1"  # a seed that does not answer: the next one is asked
    live = [f"127.0.0.1:{p}" for p in redis_cluster.ports]
    client = redis.cluster.RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", redis_cluster.ports[0])]
    )
    prefix = _prefix()
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 4)
    for nodes in (
        [dead, *live],
        [("127.0.0.1", p) for p in redis_cluster.ports],
        f"redis-cluster://{dead},{live[1]}",
        client,
    ):
        with RedisClusterStore(nodes, prefix=prefix) as store:
            store.put("k", src)
            got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
            assert sorted(store.masters) == sorted(("127.0.0.1", p) for p in redis_cluster.ports)
    with open_store(redis_cluster.url, prefix=prefix) as store:
        assert isinstance(store, RedisClusterStore) and store.exists("k")
    client.close()
    src.ref_count_down()


def test_a_single_node_is_not_a_cluster(redis_server: Any) -> None:
    with pytest.raises(RemoteStoreError, match="cluster-enabled"):
        RedisClusterStore([f"127.0.0.1:{redis_server.port}"])


# -- the cluster changes under the store --------------------------------


def _move_slot(cluster: RedisCluster, slot: int, src: int, dst: int, keys: list[str]) -> None:
    """Migrate ``keys`` (all of ``slot``) from ``src`` to ``dst`` and give ``dst`` the slot."""
    ids = _node_ids(cluster)
    _admin(cluster, dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    _admin(cluster, src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    if keys:
        _admin(cluster, src).execute_command(
            "MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys
        )
    for port in cluster.ports:
        _admin(cluster, port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])


def test_moved_slot_is_followed_and_the_map_read_again(
    own_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = RedisClusterStore(own_cluster.url, prefix="m:")
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 5)
    store.put("{tag}a", src)
    slot = key_slot(b"m:{tag}a")
    old = _owner_port(own_cluster, store, "{tag}a")
    new = next(p for p in own_cluster.ports if p != old)
    _move_slot(own_cluster, slot, old, new, ["m:{tag}a"])
    # The store still has the old map: the old owner answers MOVED.
    got = store.get("{tag}a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    assert _owner_port(own_cluster, store, "{tag}a") == new  # the map was read again
    store.put("{tag}b", src)
    assert _admin(own_cluster, new).exists("m:{tag}b") == 1
    assert store.batched_delete(["{tag}a", "{tag}b"]) == 2
    src.ref_count_down()
    store.close()


def test_ask_during_a_migration(
    own_cluster: RedisCluster, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = RedisClusterStore(own_cluster.url, prefix="a:")
    objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(3)]
    datas = [fill(o, 10 + i) for i, o in enumerate(objs)]
    store.batched_put(["{t}moved", "{t}stays"], objs[:2])
    slot = key_slot(b"a:{t}moved")
    src = _owner_port(own_cluster, store, "{t}moved")
    dst = next(p for p in own_cluster.ports if p != src)
    ids = _node_ids(own_cluster)
    _admin(own_cluster, dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    _admin(own_cluster, src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    _admin(own_cluster, src).execute_command(
        "MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", "a:{t}moved"
    )
    # The slot is still the source's; it answers ASK for the key that left.
    got = store.batched_get(["{t}moved", "{t}stays"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == datas[:2]  # type: ignore[union-attr]
    assert store.head("{t}moved").size == objs[0].get_size()  # type: ignore[union-attr]
    store.put("{t}new", objs[2])  # absent at the source: ASK, written at the destination
    count = _admin(own_cluster, dst).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
    assert count == 2  # {t}moved and {t}new
    assert store.exists("{t}new") and store.delete("{t}moved")
    assert _owner_port(own_cluster, store, "{t}moved") == src  # ASK does not change the map
    for obj in (*objs, *got):
        obj.ref_count_down()  # type: ignore[union-attr]
    store.close()


def test_killed_master_fails_its_slots_only_and_recovers(
    own_cluster: RedisCluster, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = _prefix()
    store = RedisClusterStore(own_cluster.url, prefix=prefix, timeout=5.0)
    keys = _keys_over_all_slots(prefix, 96)
    objs = big_pool.batched_allocate(KV_SHAPE, KV_DTYPE, 96, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    store.batched_put(keys, objs)
    victim = own_cluster.ports[1]
    on_victim = {k for k in keys if _owner_port(own_cluster, store, k) == victim}
    assert 0 < len(on_victim) < len(keys)

    # A reader runs through the keys while the master is killed mid-run.
    started, stop = threading.Event(), threading.Event()
    seen: dict[str, set[type]] = {k: set() for k in keys}
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for i, key in enumerate(keys):
                try:
                    got = store.get(key, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
                except RemoteStoreError as exc:
                    seen[key].add(type(exc))
                else:
                    if got is None or bytes(got.byte_array) != datas[i]:
                        bad.append(key)
                    if got is not None:
                        got.ref_count_down()
                started.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert started.wait(30)
    own_cluster.kill(victim)
    # Every key of the victim fails (typed, fast), every other key works.
    for i, key in enumerate(keys):
        if key in on_victim:
            with pytest.raises(StoreConnectionError):
                _bounded(lambda key=key: store.get(key, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT), 15)
        else:
            got = _bounded(lambda key=key: store.get(key, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT), 15)
            assert got is not None and bytes(got.byte_array) == datas[i]
            got.ref_count_down()
    stop.set()
    thread.join(30)
    assert not thread.is_alive() and not bad
    assert all(seen[k] <= {StoreConnectionError} for k in keys)
    assert not any(seen[k] for k in keys if k not in on_victim)
    assert all(seen[k] for k in on_victim)  # the reader saw them fail too
    # A batch across every master fails as a whole (nothing leaks) ...
    with pytest.raises(StoreConnectionError, match="more key"):
        _bounded(lambda: store.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT), 15)
    assert big_pool.stats().active_objects == 96
    # ... while one over the live masters works, and so do writes there.
    alive = [k for k in keys if k not in on_victim]
    alive_objs = [o for k, o in zip(keys, objs, strict=True) if k not in on_victim]
    store.batched_put(alive, alive_objs)
    assert store.batched_exists(alive) == [True] * len(alive)

    own_cluster.restart(victim)  # back with its slots, empty (no persistence)
    lost = sorted(on_victim)
    assert _bounded(lambda: store.batched_exists(lost), 15) == [False] * len(lost)
    store.batched_put(keys, objs)
    got = store.batched_get(keys, big_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
    big_pool.batched_free([*objs, *got])  # type: ignore[list-item]
    store.close()
