"""RedisStore against a real redis-server: damaged entries, lost servers, timeouts.

The round trips, batched forms and misuse are in ``test_stores.py`` (run on
both stores); here is what only a server can do.  Also, without a server:
the missing-client error and the copy-free command packing.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import (
    CorruptEntryError,
    FeatureUnavailableError,
    InvalidArgumentError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote import RedisStore, open_store
from kvpool.remote.header import encode_header, key_tag, layout_for

from .conftest import (
    KV_DTYPE,
    KV_FMT,
    KV_SHAPE,
    RedisServer,
    assert_clean,
    fill,
    need_redis,
    start_redis,
)

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def _raw(server: RedisServer, *args: bytes) -> bytes:
    """Send one command on a plain socket; return the raw reply."""
    parts = [b"*%d\r\n" % len(args)] + [b"$%d\r\n%b\r\n" % (len(a), a) for a in args]
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"".join(parts))
        time.sleep(0.02)
        return s.recv(1 << 20)


def _put_one(store: RedisStore, pool: kvpool.TensorMemoryAllocator, key: str = "k") -> bytes:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 1)
    store.put(key, src)
    src.ref_count_down()
    return data


def _header(size: int = KV_BYTES, rkey: bytes | None = b"k", crc: int | None = None) -> bytes:
    """A header as RedisStore writes it for ``rkey`` (None: without key tag)."""
    layout = layout_for([KV_SHAPE], [KV_DTYPE])
    return encode_header(layout, KV_FMT, size, crc, None if rkey is None else key_tag(rkey))


def _both_gets_fail(store: RedisStore, pool: kvpool.TensorMemoryAllocator, error: type, match: str):
    with pytest.raises(error, match=match):
        store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert pool.stats().active_objects == 0
    with pytest.raises(error, match=match):
        store.get("k", pool)
    assert pool.stats().active_objects == 0
    with pytest.raises(error, match=match):
        store.batched_get(["k"], pool)
    assert pool.stats().active_objects == 0 and pool.memcheck()


# -- damaged entries ---------------------------------------------------
# The entry format is one string value: header (with the key tag) + bytes.


def _damaged(rkey: bytes) -> list[tuple[bytes, str]]:
    good = _header(rkey=rkey)
    flipped = good[:40] + bytes([good[40] ^ 0xFF]) + good[41:]
    payload = b"x" * KV_BYTES
    return [
        (good + payload[:-1], "8191 payload bytes stored"),
        (good + payload + b"x", "8193 payload bytes stored"),
        (good, "0 payload bytes stored"),
        (payload, "not a kvpool entry"),
        (b"garbage", "truncated"),
        (b"NOPE" + good[4:] + payload, "not a kvpool entry"),
        (flipped + payload, "CRC"),
        (good[:-1], "truncated header"),
        (good + bytes(64) + payload, "8256 payload bytes stored"),
        (_header(rkey=rkey + b"-other") + payload, "belongs to another key"),
        (_header(rkey=None) + payload, "no key tag"),
    ]


@pytest.mark.redis
@pytest.mark.parametrize("case", range(len(_damaged(b""))))
def test_damaged_entries(
    redis_server: RedisServer,
    redis_store: RedisStore,
    pool: kvpool.TensorMemoryAllocator,
    case: int,
) -> None:
    key = redis_store._prefix + b"k"
    value, match = _damaged(key)[case]
    assert _raw(redis_server, b"SET", key, value) == b"+OK\r\n"
    _both_gets_fail(redis_store, pool, CorruptEntryError, match)
    with pytest.raises(CorruptEntryError):
        redis_store.head("k")


@pytest.mark.redis
def test_old_hash_format_and_other_types_are_refused(
    redis_server: RedisServer, redis_store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    key = redis_store._prefix + b"k"
    # The hash format of earlier kvpool versions: HSET k h <header> d <bytes>.
    old = _header(rkey=None)
    assert _raw(redis_server, b"HSET", key, b"h", old, b"d", b"x" * KV_BYTES) == b":2\r\n"
    _both_gets_fail(redis_store, pool, CorruptEntryError, "hash format of earlier kvpool")
    with pytest.raises(CorruptEntryError, match="hash format"):
        redis_store.head("k")
    assert redis_store.exists("k")
    # put replaces whatever the key held
    data = _put_one(redis_store, pool)
    got = redis_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    assert _raw(redis_server, b"DEL", key) == b":1\r\n"
    assert _raw(redis_server, b"RPUSH", key, b"a") == b":1\r\n"
    _both_gets_fail(redis_store, pool, CorruptEntryError, "did not write")


@pytest.mark.redis
def test_key_of_another_type(
    redis_server: RedisServer, redis_store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    key = redis_store._prefix + b"k"
    assert _raw(redis_server, b"SET", key, b"plain string") == b"+OK\r\n"
    _both_gets_fail(redis_store, pool, CorruptEntryError, "not a kvpool entry")
    with pytest.raises(CorruptEntryError, match="not a kvpool entry"):
        redis_store.head("k")
    assert redis_store.exists("k")
    # put replaces whatever the key held
    data = _put_one(redis_store, pool)
    got = redis_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()


@pytest.mark.redis
def test_flipped_payload_byte_with_checksum(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    with RedisStore(redis_server.url, prefix="crc:", checksum=True) as store:
        _put_one(store, pool)
        info = store.head("k")
        assert info is not None and info.payload_crc is not None
        offset = b"%d" % (info.header_size + 100)
        assert _raw(redis_server, b"SETRANGE", b"crc:k", offset, b"\x00") == b":%d\r\n" % (
            info.header_size + KV_BYTES
        )
        _both_gets_fail(store, pool, CorruptEntryError, "CRC")


@pytest.mark.redis
def test_store_still_works_after_errors(
    redis_store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    data = _put_one(redis_store, pool)
    for _ in range(3):
        with pytest.raises(InvalidArgumentError, match="layout mismatch"):
            redis_store.get("k", pool, torch.Size([8]), torch.uint8, KV_FMT)
        got = redis_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()


# -- lost servers and timeouts ----------------------------------------


@pytest.mark.redis
def test_server_killed(own_redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator) -> None:
    store = RedisStore(own_redis_server.url, timeout=2.0)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("k", src)
    own_redis_server.kill()
    for call in (
        lambda: store.put("k", src),
        lambda: store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: store.get("k", pool),
        lambda: store.batched_put(["a", "b"], [src, src]),
        lambda: store.batched_get(["a", "k"], pool),
        lambda: store.exists("k"),
        lambda: store.batched_exists(["k"]),
        lambda: store.delete("k"),
        lambda: store.head("k"),
        store.ping,
    ):
        with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{own_redis_server.port}"):
            call()
    assert src.get_ref_count() == 1
    src.ref_count_down()
    assert_clean(pool)
    store.close()


@pytest.mark.redis
def test_server_killed_while_a_get_waits(
    own_redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = RedisStore(own_redis_server.url, timeout=10.0)
    _put_one(store, pool)
    os.kill(own_redis_server.proc.pid, signal.SIGSTOP)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.2)  # the get has sent its command and waits for the reply
    own_redis_server.kill()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StoreConnectionError), errors
    assert_clean(pool)
    store.close()


@pytest.mark.redis
def test_server_killed_in_the_middle_of_a_large_value(
    own_redis_server: RedisServer,
) -> None:
    # 128 MiB: the server is killed while the reply is still streaming in.
    big = kvpool.TensorMemoryAllocator(torch.empty(260 << 20, dtype=torch.uint8))
    src = big.allocate(torch.Size([128 << 20]), torch.uint8, kvpool.MemoryFormat.BINARY)
    store = RedisStore(own_redis_server.url, timeout=10.0)
    store.put("big", src)
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while True:
                got = store.get("big", big)
                got.ref_count_down()  # type: ignore[union-attr]
        except BaseException as exc:
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.3)
    own_redis_server.kill()
    thread.join(20)
    assert done.is_set() and len(errors) == 1
    assert isinstance(errors[0], StoreConnectionError), errors
    assert big.stats().active_objects == 1 and big.memcheck()  # only src
    src.ref_count_down()
    store.close()
    big.close()


@pytest.mark.redis
def test_timeout(own_redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator) -> None:
    store = RedisStore(own_redis_server.url, timeout=0.3)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 1)
    store.put("k", src)
    os.kill(own_redis_server.proc.pid, signal.SIGSTOP)
    try:
        for call in (
            lambda: store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
            lambda: store.batched_get(["k", "k"], pool),
            lambda: store.put("k2", src),
            lambda: store.exists("k"),
        ):
            t0 = time.monotonic()
            with pytest.raises(StoreTimeoutError, match=r"0\.3 s"):
                call()
            assert time.monotonic() - t0 < 3
        assert_clean_but(pool, 1)
    finally:
        os.kill(own_redis_server.proc.pid, signal.SIGCONT)
    # the server is back: the store reconnects; the timed-out put may or may not
    # have been applied, but whole
    got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == data
    got2 = store.get("k2", pool)
    assert got2 is None or bytes(got2.byte_array) == data
    for obj in (src, got, got2):
        if obj is not None:
            obj.ref_count_down()
    store.close()


def assert_clean_but(pool: kvpool.TensorMemoryAllocator, live: int) -> None:
    assert pool.memcheck() and pool.stats().active_objects == live


@pytest.mark.redis
def test_unreachable_server() -> None:
    need_redis()
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}"):
        RedisStore(f"redis://127.0.0.1:{port}/0", timeout=1.0)
    assert time.monotonic() - t0 < 5
    store = RedisStore(f"redis://127.0.0.1:{port}/0", ping=False)  # lazy: fails on use
    with pytest.raises(StoreConnectionError):
        store.exists("k")
    store.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.redis
def test_open_store_redis(redis_server: RedisServer) -> None:
    with open_store(redis_server.url, prefix="o:") as store:
        assert isinstance(store, RedisStore) and store.server.endswith(f":{redis_server.port}/0")
    with open_store(f"valkey://127.0.0.1:{redis_server.port}/1") as store:
        assert isinstance(store, RedisStore) and store.server.endswith("/1")


@pytest.mark.redis
def test_bad_arguments(redis_server: RedisServer) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout"):
        RedisStore(redis_server.url, timeout=0)
    with pytest.raises(InvalidArgumentError, match="url"):
        RedisStore(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Redis URL"):
        RedisStore("http://x")
    with pytest.raises(InvalidArgumentError, match="key"):
        RedisStore(redis_server.url, prefix=3)  # type: ignore[arg-type]


@pytest.mark.redis
def test_server_refusal_is_a_store_error(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    # A server that refuses writes (maxmemory 1 byte, noeviction).
    with RedisStore(redis_server.url, prefix="oom:") as store:
        assert _raw(redis_server, b"CONFIG", b"SET", b"maxmemory", b"1") == b"+OK\r\n"
        try:
            src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            with pytest.raises(RemoteStoreError, match="OOM"):
                store.put("k", src)
            src.ref_count_down()
        finally:
            _raw(redis_server, b"CONFIG", b"SET", b"maxmemory", b"0")
        assert not store.exists("k")


# -- without a server ---------------------------------------------------


def test_missing_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    with pytest.raises(FeatureUnavailableError, match=r"pip install 'kvpool\[redis\]'"):
        RedisStore("redis://127.0.0.1:1/0")
    with pytest.raises(FeatureUnavailableError, match="kvpool"):
        open_store("redis://127.0.0.1:1/0")


class _Conn:
    """Records the first command a RedisStore plan sends, then fails like a lost connection."""

    reader = None

    def __init__(self) -> None:
        self.sent: list[object] = []

    def run(self, plan: Any, deadline: float) -> None:
        self.sent = list(plan.send(None).parts)
        plan.close()
        raise ConnectionResetError("stop here")


class _Pool:
    def __init__(self) -> None:
        self.conn = _Conn()
        self.discarded = 0

    def acquire(self, deadline: float) -> _Conn:
        return self.conn

    def discard(self, conn: _Conn) -> None:
        self.discarded += 1

    def close(self) -> None:
        pass


def test_put_hands_the_object_memory_to_the_socket_uncopied(
    pool: kvpool.TensorMemoryAllocator,
) -> None:
    pytest.importorskip("redis")
    store = RedisStore("redis://127.0.0.1:1/0", ping=False)
    fake = _Pool()
    store._pool = fake  # type: ignore[assignment]
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    with pytest.raises(StoreConnectionError):
        store.put("k", src)
    assert fake.discarded == 1  # a failed call never gives its connection back
    views = [x for x in fake.conn.sent if isinstance(x, memoryview)]
    assert len(views) == 1
    view = views[0]
    assert view.nbytes == src.get_size() and not view.readonly
    # the same memory as the object's, not a copy
    view[0] ^= 0xFF
    assert src.byte_array[0] == view[0]
    assert all(isinstance(x, bytes) and len(x) < 512 for x in fake.conn.sent if x is not view)
    assert src.get_ref_count() == 1
    src.ref_count_down()
    store.close()


@pytest.mark.redis
def test_kvpool_demo_against_a_real_server(redis_server) -> None:
    """``kvpool demo --store redis://...`` verifies a round trip through the server."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--chunks", "8", "--store", redis_server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "verified: all 8 chunks" in run.stdout
    assert f"store: {redis_server.url}" in run.stdout


# -- clients, pools, passwords, TTL --------------------------------------


@pytest.mark.redis
def test_existing_client_or_pool(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=redis_server.port, db=3)
    for given in (
        client,
        client.connection_pool,
        redis.ConnectionPool.from_url(f"redis://127.0.0.1:{redis_server.port}/3"),
    ):
        with RedisStore(given, prefix="given:") as store:
            assert store.server == f"127.0.0.1:{redis_server.port}/3"
            data = _put_one(store, pool)
            got = store.get("k", pool)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
            assert client.exists(b"given:k") == 1  # in db 3, where the client points
            assert store.delete("k")
    assert client.ping()  # the given client is not closed or disturbed
    client.close()


@pytest.mark.redis
def test_asyncio_or_cluster_clients_are_refused(redis_server: RedisServer) -> None:
    import redis
    import redis.asyncio

    with pytest.raises(InvalidArgumentError, match="AsyncRedisStore"):
        RedisStore(redis.asyncio.Redis(port=redis_server.port))
    with pytest.raises(InvalidArgumentError, match=r"redis\.Redis client"):
        RedisStore(object())


@pytest.mark.redis
def test_password_protected_server(pool: kvpool.TensorMemoryAllocator) -> None:
    secret = "s3cret-Passw0rd"
    server = start_redis(need_redis(), "--requirepass", secret)
    try:
        with RedisStore(f"redis://:{secret}@127.0.0.1:{server.port}/0") as store:
            data = _put_one(store, pool)
            got = store.get("k", pool)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
            assert secret not in repr(store)
        for url in (
            f"redis://127.0.0.1:{server.port}/0",
            f"redis://:wrong-{secret}@127.0.0.1:{server.port}/0",
        ):
            with pytest.raises(StoreConnectionError) as info:
                RedisStore(url)
            assert secret not in str(info.value)
    finally:
        server.stop()


def _pttl(server: RedisServer, key: bytes) -> int:
    return int(_raw(server, b"PTTL", key)[1:-2])


@pytest.mark.redis
def test_ttl_per_put_and_per_store(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    with RedisStore(redis_server.url, prefix="ttl:") as store:
        store.put("forever", src)
        assert _pttl(redis_server, b"ttl:forever") == -1
        store.put("short", src, ttl=30)
        assert 0 < _pttl(redis_server, b"ttl:short") <= 30_000
        store.batched_put(["b1", "b2"], [src, src], ttl=2.5)
        assert 0 < _pttl(redis_server, b"ttl:b2") <= 2_500
        for bad in (0, -1, float("nan"), "1", True):
            with pytest.raises(InvalidArgumentError, match="ttl"):
                store.put("bad", src, ttl=bad)  # type: ignore[arg-type]
        assert not store.exists("bad")
    with RedisStore(redis_server.url, prefix="ttl:", ttl=60) as store:
        store.put("default", src)
        assert 0 < _pttl(redis_server, b"ttl:default") <= 60_000
        store.put("override", src, ttl=5)
        assert 0 < _pttl(redis_server, b"ttl:override") <= 5_000
        store.put("gone", src, ttl=0.05)
        deadline = time.monotonic() + 10
        while store.exists("gone") and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the server with a deadline, not synchronisation
        assert store.get("gone", pool) is None
    with pytest.raises(InvalidArgumentError, match="ttl"):
        RedisStore(redis_server.url, ttl=0)
    src.ref_count_down()


@pytest.mark.redis
@pytest.mark.parametrize("window", [None, 1, 3, 64])
def test_batches_larger_than_the_window(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator, window: int
) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 20, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    keys = [f"w{i}" for i in range(20)]
    with RedisStore(redis_server.url, prefix=f"win{window}:", window=window) as store:
        store.batched_put(keys, objs)
        pool.batched_free(objs)
        got = store.batched_get(keys, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
        pool.batched_free(got)  # type: ignore[arg-type]
        # The stored layout: the window follows the first entry found.
        got = store.batched_get(["none1", "none2", *keys, "none3"], pool)
        assert got[:2] == [None, None] and got[-1] is None
        assert [bytes(g.byte_array) for g in got[2:-1]] == datas  # type: ignore[union-attr]
        pool.batched_free(got[2:-1])  # type: ignore[arg-type]
        many = [f"m{i}" for i in range(1000)]
        assert store.batched_exists([*keys, *many]) == [True] * 20 + [False] * 1000
        assert store.batched_delete([*keys, *many]) == 20
    with pytest.raises(InvalidArgumentError, match="window"):
        RedisStore(redis_server.url, window=0)
